"""`autok sweep`: a joint search over K, β, LR (and any train flag), each trial a full run.

Optuna embedded (sqlite in the sweep dir, or --storage postgresql://... for several machines)
or Ray Tune on a cluster (OptunaSearch over the same space, ASHA). Outputs in DIR: trials.csv,
pareto.csv, pareto.png, best.yaml, and a printed table.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import math
import re
import secrets
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

import yaml

from autok.config import SEED_MAX, ConfigError, TrainConfig, first_difference, flag, load_config
from autok.controllers import POLICIES, reads, revision_problem
from autok.pareto import pareto_front, plot_front
from autok.space import (
    CONDITIONAL,
    Dim,
    applies,
    as_ran,
    check_settings,
    never_read,
    one_off,
    suggest_all,
    trial_settings,
    unread_reason,
)
from autok.trainer.loop.environment import difference, environment
from autok.training_settings import DIVIDES_BY_SECOND_MOMENT
from autok.trials import COMPLETE, FAIL, INTERRUPTED, PRUNED, TrialResult, run_trial

# The task's metric (accuracy, or its own, e.g. perplexity) in its own direction.
OBJECTIVES = ("pareto", "metric", "time-to-target")
OBJECTIVE_ALIASES = {"accuracy": "metric", "time-to-accuracy": "time-to-target"}
Direction = Literal["minimize", "maximize"]  # an Optuna study direction


@dataclass(frozen=True)
class SweepOptions:
    backend: str = "optuna"
    trials: int = 10
    jobs: int = 1
    out: Path = Path("sweeps/default")
    resume: bool = False
    storage: str | None = None
    study_name: str = "autok"
    objective: str = "pareto"
    pruner: str = "median"
    target: float = 0.9  # the metric value time-to-target measures the time to
    metric_name: str = "accuracy"
    higher_is_better: bool = True
    seed: int = 0
    address: str | None = None  # ray
    enqueue: tuple[dict, ...] = ()  # settings to evaluate first (warm start)
    workdir: str | None = None  # where trials start (the sweep's directory: --task modules)


# What a trial's result adds to its row of trials.csv; studies made before tasks stored the
# same values under the accuracy names.
RESULT_KEYS = ("peak_test_metric", "wall_seconds", "time_to_target", "total_seconds")
OLD_NAMES = {"peak_test_metric": "peak_test_accuracy", "time_to_target": "time_to_accuracy"}


class TrialFailed(Exception):
    pass


class _NoTraceForTrialFailed(logging.Filter):
    """Optuna logs a failed trial with its exception's traceback. A TrialFailed is a trial the
    sweep judged failed (invalid settings, a run that failed: its reason is in the line, the
    run's own output in its console.log), not a fault in the code: one line, no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], TrialFailed):
            record.exc_info, record.exc_text = None, None
        return True


def _quiet_trial_failures() -> None:
    """Installed once on the logger of Optuna's optimize loop, which logs the failures."""
    log = logging.getLogger("optuna.study._optimize")
    if not any(isinstance(f, _NoTraceForTrialFailed) for f in log.filters):
        log.addFilter(_NoTraceForTrialFailed())


# ----- secrets in URLs -------------------------------------------------------------------------

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


# A query parameter that carries a secret (libpq takes `?password=`; drivers take tokens and
# API keys), by its exact name: `sslkey=` or `passfile=` name files, not secrets
_SECRET_PARAM = re.compile(
    r"([?&;](?:password|passwd|pwd|sslpassword|secret|client_secret|token|access_token|"
    r"auth_token|api_key|apikey)=)([^&;#]*)",
    re.IGNORECASE,
)
# where a parser may cut a password it misreads: each piece may surface alone in its message
_CUTS = re.compile(r"[@:]")


def redact_url(url: str) -> str:
    """`url` with its password shown as *** (`postgresql://user:***@host/db`), as sqlalchemy's
    make_url(url).render_as_string(hide_password=True) does, but for any text: a URL that no
    parser accepts is the one most likely to end up in an error message. Secret query
    parameters (`?password=...`) are hidden too."""
    url = _SECRET_PARAM.sub(
        lambda m: m[0] if m[2].startswith("***") else m[1] + ("***" if m[2] else ""), url
    )
    prefix, userinfo, at, hostpart = _split_url(url)
    user, colon, password = userinfo.partition(":")
    if not (at and colon) or password == "***":
        return url
    return f"{prefix}{user}:***@{hostpart}"


def _split_url(url: str) -> tuple[str, str, str, str]:
    """(what comes before the userinfo, the userinfo, "@", the rest). Without a "://" (no
    scheme, or a mistyped one: `postgresql//`, `postgresql:/`, which is how a URL ends up in an
    error message) the userinfo is what follows the last "/" before the "@"."""
    scheme, sep, rest = url.partition("://")
    schemed = bool(sep) and "?" not in scheme  # a "://" in the query (`?next=http://x`) is none
    prefix, rest = (scheme + sep, rest) if schemed else ("", url)
    userinfo, at, hostpart = _authority_at(rest)
    if not schemed and at:
        cut = userinfo.rfind("/") + 1
        prefix, userinfo = userinfo[:cut], userinfo[cut:]
    return prefix, userinfo, at, hostpart


def _authority_at(rest: str) -> tuple[str, str, str]:
    """(userinfo, "@", the rest) of what follows "://": split at the last @ before the query,
    so a raw @ in a password stays in it and one in the query (`?user=a@b`) is no password."""
    head, q, query = rest.partition("?")
    userinfo, at, hostpart = head.rpartition("@")
    return (userinfo, at, hostpart + q + query) if at else ("", "", rest)


def _passwords(url: str) -> list[str]:
    """The secrets `url` holds: its userinfo password and its secret query parameters."""
    found = [_split_url(url)[1].partition(":")[2]]
    found += [m.group(2) for m in _SECRET_PARAM.finditer(url)]
    return [pw for pw in found if pw and pw != "***"]


def redact(text: str, *urls: str | None) -> str:
    """`text` with the password of every URL in it hidden, and with the passwords of `urls` (the
    ones given on the command line) hidden wherever they appear, raw or %-decoded, since a
    driver's message may quote one without its URL."""
    secrets: set[str] = set()
    for url in urls:
        if not url:
            continue
        for pw in _passwords(url):
            text = text.replace(url, redact_url(url))
            # A raw @ or : in the password makes parsers disagree on where the host or port
            # starts, and a message quoting that "host" or "port" would show the rest: hide
            # each piece too (as whole tokens, below).
            pieces = {p for whole in (pw, unquote(pw)) for p in _CUTS.split(whole)}
            secrets |= {pw, unquote(pw), *pieces}
    text = _URL.sub(lambda m: redact_url(m.group()), text)
    for secret in sorted(secrets - {""}, key=len, reverse=True):
        # whole tokens only: a short password must not garble the words that contain it
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", "***", text)
    return text


def first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


@contextlib.contextmanager
def hiding_passwords(*urls: str | None):
    """An error leaving the block carries no password of `urls` (nor of any URL it quotes). Our
    own ConfigErrors quote URLs, never bare passwords: only a library's text is searched for
    those, so a password that is also a word (a study name) leaves our messages readable."""
    try:
        yield
    except ConfigError as exc:
        if (clean := redact(str(exc))) != str(exc):
            raise ConfigError(clean) from None
        raise
    except Exception as exc:
        if (clean := redact(str(exc), *urls)) != str(exc):
            raise RuntimeError(clean) from None
        raise


# ----- Ctrl-C ----------------------------------------------------------------------------------


class StopOnSigint:
    """Ctrl-C during a sweep, taken at safe points rather than wherever it lands.

    A KeyboardInterrupt raised at an arbitrary bytecode can land in a storage write (a trial left
    RUNNING forever), inside Popen (a trial started but not yet ours to stop), or in the main
    thread only while --jobs threads carry on. Instead the first SIGINT just sets a flag (no lock
    is taken in the handler: the main thread may hold it): running trials see it within a poll
    and are stopped and recorded as FAIL (INTERRUPTED), no new trial starts, the outputs are
    written, and the sweep then raises KeyboardInterrupt (exit 130). A second SIGINT raises at
    once. Installed only from the main thread over Python's own handler, so a SIGINT the caller
    ignores (a background job of a script) stays ignored."""

    def __init__(self) -> None:
        self.requested = False
        self._old: Any = None

    def __call__(self) -> bool:
        return self.requested

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> StopOnSigint:
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
            self._old = None


def _as_ran(was_fixed: dict[str, Any], space: list[Dim]) -> tuple[dict[str, Any], list[str]]:
    """A resumed study's fixed part as its trials ran it (autok.space.as_ran), and the notes:
    a study made before autok refused a setting its trials never applied resumes without it
    (the refusal now asks to drop it). A setting that some drawn choice reads stays."""
    choosers = {d.name: d.choices for d in space if d.choices}
    unread = never_read(was_fixed)
    kept = {
        name: value
        for name, value in was_fixed.items()
        if name in unread
        and (chooser := CONDITIONAL.get(name, (None,))[0]) in choosers
        and any(name not in never_read({**was_fixed, chooser: c}) for c in choosers[chooser])
    }
    out, notes = as_ran({k: v for k, v in was_fixed.items() if k not in kept})
    return out | kept, notes


def check_space(fixed: dict[str, Any], space: list[Dim]) -> None:
    """Before any trial: each dimension has a value that makes a valid run with the fixed part
    (its ends, or its choices, each with the others unset). One that has none would fail every
    trial, each on the same error: a ConfigError naming --space and the dimension. A
    conditional setting (CONDITIONAL: a K-policy option, SGD's momentum) is tried under each
    value the space draws for its choosing setting that reads it (suggest_all draws it only
    there); with none, it has no valid value."""
    dims = {d.name: d for d in space}
    for d in space:
        values = d.ends()
        contexts: list[dict[str, Any]] = [{}]
        if (cond := CONDITIONAL.get(d.name)) is not None and cond[0] in dims:
            contexts = [{cond[0]: c} for c in dims[cond[0]].choices or ()]
        read = [c for c in contexts if applies(d.name, {**fixed, **c})]
        if not read:
            chosen = [c.get(cond[0]) for c in contexts if c] if cond is not None else []
            why = unread_reason(d.name, fixed, chosen)
            raise ConfigError(f"--space: {d.name}: no value of it makes a valid run: {why}")
        whys = [check_settings(fixed, {**c, d.name: v}) for c in read for v in values]
        if all(whys):
            raise ConfigError(f"--space: {d.name}: no value of it makes a valid run: {whys[0]}")
        # each choice too: one that makes no valid run with any draw near the others (--policy
        # scheduled with no --k-schedule) would fail every trial that draws it; tried only
        # where it is read (a trial that does not read it drops it, and says nothing of it)
        others = [o for o in one_off(space, (d.name,)) if applies(d.name, {**fixed, **o})]
        for c in d.choices or ():
            whys = [check_settings(fixed, {**o, d.name: c}) for o in others]
            if whys and all(whys):
                raise ConfigError(
                    f"--space: {d.name}: choice {c!r:.40} makes no valid run: {whys[0]}"
                )


def objective_values(opts: SweepOptions, res: TrialResult) -> list[float]:
    # The Pareto objective's time is the run's training wall-clock, what K, beta and the LR
    # change; the start-up a trial also costs (processes, data: about the same for every
    # trial) is reported beside it as total_seconds.
    if opts.objective == "pareto":
        return [res.peak_test_metric, res.wall_seconds]
    if opts.objective == "metric":
        return [res.peak_test_metric]
    return [res.time_to_target]


def directions(opts: SweepOptions) -> list[Direction]:
    """Optuna's study directions for the objective values, in order."""
    metric: Direction = "maximize" if opts.higher_is_better else "minimize"
    by_objective: dict[str, list[Direction]] = {
        "pareto": [metric, "minimize"],
        "metric": [metric],
        "time-to-target": ["minimize"],
    }
    return by_objective[opts.objective]


def intermediate(opts: SweepOptions, value: float) -> float:
    """Per-epoch value reported for pruning, in the study's direction: the metric itself when
    optimizing it; when minimizing the time to a target, a value that falls as the metric
    improves (the error 1 - accuracy, the loss or perplexity itself)."""
    if opts.objective == "metric" or not opts.higher_is_better:
        return value
    return 1.0 - value if opts.metric_name == "accuracy" else -value


def oriented(opts: SweepOptions, value: float) -> float:
    """The metric with higher always better (for the Pareto front and the ranking)."""
    return value if opts.higher_is_better else -value


# ----- one line per trial as it ends -----------------------------------------------------------

SHOWN = {"sync_period": "K", "slowmo_beta": "beta", "lr": "LR"}  # ASCII: any terminal encoding


def _shown(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else "-" if v is None else str(v)


def trial_knobs(fixed: dict[str, Any], params: dict[str, Any]) -> str:
    """K, β and LR as the trial ran them (the fixed part, the drawn values, the defaults these
    resolve to), then any other drawn value."""
    settings = trial_settings(fixed, params)
    try:
        ran: dict[str, Any] = load_config({}, settings).model_dump()
    except ConfigError:  # settings the trial refused: its line says why; these as drawn
        ran = settings
    knobs = [f"{label}={_shown(ran.get(name))}" for name, label in SHOWN.items()]
    return " ".join(knobs + [f"{k}={_shown(v)}" for k, v in params.items() if k not in SHOWN])


class TrialLines:
    """Says each trial as it ends, on stdout: its number, state, K, β, LR, metric and time, so
    a sweep of hours is not silent until its table. On a terminal a progress bar (stderr) counts
    the trials; into a pipe or a file, never (a log gets lines, not carriage returns;
    docs/design.md §7, Sweep)."""

    def __init__(self, opts: SweepOptions, fixed: dict[str, Any]) -> None:
        from tqdm import tqdm

        self.opts, self.fixed, self.ended = opts, fixed, 0
        self.lock = threading.Lock()  # trials end on Optuna's worker threads (--jobs)
        self.bar = tqdm(
            total=opts.trials,
            unit="trial",
            file=sys.stderr,
            disable=not sys.stderr.isatty(),
            dynamic_ncols=True,
        )

    def trial_ended(
        self, number: int, state: str, params: dict[str, Any], res: dict[str, Any], seconds: float
    ) -> None:
        """`res`: the row's result keys (RESULT_KEYS and reason); `seconds`: the trial's time."""
        with self.lock:
            self.ended += 1
            line = (
                f"autok: trial {number} ({self.ended}/{self.opts.trials}) {state}: "
                f"{trial_knobs(self.fixed, params)} | {self._outcome(state, res)} | "
                f"{seconds:.0f} s"
            )
            self.bar.write(line, file=sys.stdout)  # above the bar, which stays at the bottom
            sys.stdout.flush()
            self.bar.update(1)

    def _outcome(self, state: str, res: dict[str, Any]) -> str:
        value = res.get("peak_test_metric")
        metric = f"peak {self.opts.metric_name} {_shown(value)}"
        if state == COMPLETE:
            wall = res.get("wall_seconds")
            return metric + (f", {wall:.1f} s of training" if wall is not None else "")
        why = redact(str(res.get("reason") or "").strip()[:200])
        return f"{metric}, {why}" if value is not None else why or "-"

    def close(self) -> None:
        self.bar.close()


# ----- Optuna ----------------------------------------------------------------------------------


def _storage(opts: SweepOptions):
    import optuna

    if opts.storage:
        try:
            return optuna.storages.RDBStorage(opts.storage)
        except Exception as exc:  # a bad URL, a missing driver, an unreachable server
            why = redact(first_line(exc), opts.storage)
            raise ConfigError(f"--storage: {redact_url(opts.storage)}: {why}") from None
    url = f"sqlite:///{(opts.out / 'study.db').resolve()}"
    # Parallel trials write from several threads: wait for the lock instead of failing fast
    # ("database is locked"), and let SQLite's WAL journal keep readers off the writer.
    return optuna.storages.RDBStorage(
        url,
        engine_kwargs={"connect_args": {"timeout": 120}},
        skip_compatibility_check=False,
    )


def sweep_optuna(opts: SweepOptions, fixed: dict[str, Any], space: list[Dim]) -> list[dict]:
    """Run the study; its rows. Ctrl-C: see StopOnSigint. No error shows the storage password."""
    with StopOnSigint() as stop, hiding_passwords(opts.storage):
        rows = _optimize(opts, fixed, space, stop)
    if stop():
        raise KeyboardInterrupt
    return rows


# The K exposed-sync starts at where none is given, recorded in a study when it is made: a study
# made before it was recorded started those trials at 4 (docs/policies.md, "Where it starts").
K_START_ATTR = "exposed_sync_starts_at"
ENVIRONMENT_ATTR = "environment"  # the study's Python, packages and CPU, set when it is made
EXPOSED_SYNC_START = 1


def k_start_problem(attrs: dict[str, Any], fixed: dict[str, Any], space: list[Dim]) -> str | None:
    """Why a study cannot be resumed by this version (the rest of one line), or None: it was made
    when exposed-sync started at K = 4 unless given, and some new trial could start at 1."""
    if attrs.get(K_START_ATTR) == EXPOSED_SYNC_START:
        return None
    drawn = {d.name: d.choices for d in space}
    if "sync_period" in fixed or "sync_period" in drawn:
        return None  # every trial's K is given
    policies = drawn.get("policy") or (fixed.get("policy", "fixed"),)
    rules = drawn.get("k_rule") or (fixed.get("k_rule", "direct"),)
    lowering = drawn.get("k_lowering") or (fixed.get("k_lowering", True),)
    if "exposed-sync" not in policies or "direct" not in rules or True not in lowering:
        return None
    return (
        "was made when exposed-sync started at K = 4 unless given; its new trials would start "
        "at 1 beside its old ones at 4: choose a new --out"
    )


FLOOR_ATTR = "k_floor_follows_optimizer"  # set on a study made since (docs/design.md §6)


def k_floor_problem(attrs: dict[str, Any], fixed: dict[str, Any], space: list[Dim]) -> str | None:
    """Why a study cannot be resumed by this version (the rest of one line), or None: it was made
    when exposed-sync's and composite's K floor was 1 unless given, and some new trial could
    run one of them under AdamW, whose floor is 2 now."""
    if attrs.get(FLOOR_ATTR) is True:
        return None
    drawn = {d.name: d.choices for d in space}
    given = fixed.get("k_floor") is not None or (
        "k_floor" in drawn and None not in (drawn["k_floor"] or ())
    )
    if given or fixed.get("max_sync_period") == 1:
        return None  # every trial's floor is given, or K is 1 whatever the optimizer
    policies = drawn.get("policy") or (fixed.get("policy", "fixed"),)
    optimizers = drawn.get("optimizer") or (fixed.get("optimizer", "sgd"),)
    if not any(reads(p, "k_floor") for p in policies):
        return None
    if not any(DIVIDES_BY_SECOND_MOMENT.get(o) for o in optimizers if isinstance(o, str)):
        return None
    return (
        "was made when exposed-sync's K floor was 1 unless given; its new AdamW trials would "
        "keep K at 2 or above beside its old ones at 1: choose a new --out"
    )


DROP_ATTR = "link_drop_on"  # set on a study made since (docs/design.md §6, "a faster link")


def link_drop_problem(attrs: dict[str, Any], fixed: dict[str, Any], space: list[Dim]) -> str | None:
    """Why a study cannot be resumed by this version (the rest of one line), or None: it was made
    when exposed-sync and composite met a faster link after a whole window (--link-drop 0) unless
    told, and some new trial could run one of them with the check on (3 now)."""
    if attrs.get(DROP_ATTR) is True:
        return None
    drawn = {d.name: d.choices for d in space}
    if fixed.get("link_drop") is not None or "link_drop" in drawn:
        return None  # every trial's check is given, or drawn with the study
    policies = drawn.get("policy") or (fixed.get("policy", "fixed"),)
    if not any(reads(p, "link_drop") for p in policies):
        return None
    return (
        "was made when exposed-sync met a faster link after a whole window unless told; its new "
        "trials would meet it in two rounds (--link-drop 3) beside its old ones: choose a new "
        "--out"
    )


# {policy: the revision of its rule} when the study was made (docs/design.md §6, "the rule's
# revision"); a study made before it was recorded ran every policy's revision 0
REVISIONS_ATTR = "policy_revisions"


def revision_attr() -> dict[str, int]:
    """What a new study records: every registered policy's rule revision."""
    return {name: p.revision for name, p in POLICIES.items()}


def rule_problem(attrs: dict[str, Any], fixed: dict[str, Any], space: list[Dim]) -> str | None:
    """Why a study cannot be resumed by this version (the rest of one line), or None: a policy
    its new trials could run has another rule revision than the study recorded for it (none
    recorded: 0), so new trials could take other K paths beside old ones with the same
    parameters."""
    was = attrs.get(REVISIONS_ATTR)
    was = was if isinstance(was, dict) else {}
    drawn = {d.name: d.choices for d in space}
    policies = drawn.get("policy") or (fixed.get("policy", "fixed"),)
    for policy in policies:
        if (why := revision_problem(policy, was.get(policy))) is not None:
            return f"ran its trials by {why}: choose a new --out"
    return None


def _optimize(opts: SweepOptions, fixed: dict[str, Any], space: list[Dim], stop) -> list[dict]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = _storage(opts)
    summaries = optuna.get_all_study_summaries(storage)
    existing = [s.study_name for s in summaries]
    if opts.study_name in existing and not opts.resume:
        raise ConfigError(
            f"--out: study {opts.study_name!r} exists in {opts.out}; pass --resume "
            "to continue it, or choose a new --out"
        )
    if opts.resume and opts.study_name not in existing:
        raise ConfigError(f"--resume: no study {opts.study_name!r} to continue in {opts.out}")
    pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()
    if opts.objective != "pareto":  # Optuna prunes single-objective studies only
        epochs = int(fixed.get("epochs", TrainConfig.model_fields["epochs"].default))
        pruner = (
            optuna.pruners.HyperbandPruner(min_resource=1, max_resource=epochs)
            if opts.pruner == "hyperband"
            else optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
        )
    # A resumed study's sampler starts from the seed moved on by the trials it already holds:
    # the same seed would replay its first draws, and its random start-up trials would repeat
    # the parameters already tried. A fresh study keeps --sampler-seed as given.
    done = sum(s.n_trials for s in summaries if s.study_name == opts.study_name)
    seed = opts.seed + done
    if opts.resume and opts.storage:
        # machines joining one shared study at the same moment see the same count: each adds
        # a part of its own, or all would draw the same start-up points
        seed += secrets.randbelow(1 << 31)
    study = optuna.create_study(
        storage=storage,
        study_name=opts.study_name,
        directions=directions(opts),
        sampler=optuna.samplers.TPESampler(seed=seed % (SEED_MAX + 1)),
        pruner=pruner,
        load_if_exists=opts.resume,
    )
    if opts.resume and (was := [d.name.lower() for d in study.directions]) != directions(opts):
        # Optuna keeps a resumed study's directions: it would optimize one way, best.yaml and
        # the front the other.
        raise ConfigError(
            f"--resume: the study {opts.study_name!r} was made to {' and '.join(was)} "
            f"(its objective and metric); resume it with the same --objective and --task"
        )
    # A resumed study keeps its fixed part: trials under another would sit in one table, front
    # and best.yaml as if comparable. Only what does not touch a trial's result may change.
    given = {k: _plain(v) for k, v in fixed.items()}
    for problem in (k_start_problem, k_floor_problem, link_drop_problem, rule_problem):
        if opts.resume and (why := problem(study.user_attrs, fixed, space)):
            raise ConfigError(f"--resume: the study {opts.study_name!r} {why}")
    here = environment()  # a trial's numbers depend on it (trainer/loop/environment.py)
    if opts.resume and (why := difference(study.user_attrs.get(ENVIRONMENT_ATTR), here)):
        raise ConfigError(
            f"--resume: the study {opts.study_name!r} ran its trials with {why}; new trials "
            "beside them would mix two installations: choose a new --out"
        )
    if not opts.resume:
        study.set_user_attr("fixed", given)
        study.set_user_attr(K_START_ATTR, EXPOSED_SYNC_START)
        study.set_user_attr(FLOOR_ATTR, True)
        study.set_user_attr(DROP_ATTR, True)
        study.set_user_attr(REVISIONS_ATTR, revision_attr())
        study.set_user_attr(ENVIRONMENT_ATTR, here)
    elif isinstance(was_fixed := study.user_attrs.get("fixed"), dict):
        was_fixed, notes = _as_ran(was_fixed, space)
        if k := first_difference(was_fixed, given, SWEEP_RESUME_MAY_CHANGE):
            raise ConfigError(
                f"--resume: the study {opts.study_name!r} was made with "
                f"{_setting(k, was_fixed)}, this sweep gives {_setting(k, given)}; resume it "
                "with the same settings, or choose a new --out"
            )
        for note in notes:
            print(
                f"autok: note: --resume: the study {opts.study_name!r} has {note}",
                file=sys.stderr,
            )
    for params in opts.enqueue:
        study.enqueue_trial(params, skip_if_exists=True)

    def objective(trial: optuna.Trial) -> list[float] | float:
        if stop():  # Ctrl-C came between trials: this one does not start
            trial.study.stop()
            trial.set_user_attr("reason", INTERRUPTED)
            raise TrialFailed(INTERRUPTED)
        params = suggest_all(space, trial, fixed)
        run_dir = opts.out / "trials" / f"trial-{trial.number:04d}"
        trial.set_user_attr("run_dir", str(run_dir))
        if why := check_settings(fixed, params):
            trial.set_user_attr("reason", f"invalid settings: {why}")
            raise TrialFailed(why)

        def report(epoch: int, value: float) -> bool:
            if opts.objective == "pareto":
                return False
            trial.report(intermediate(opts, value), epoch)
            return trial.should_prune()

        res = run_trial(
            trial_settings(fixed, params),
            run_dir,
            report,
            opts.target,
            should_stop=stop,
            higher_is_better=opts.higher_is_better,
            workdir=opts.workdir,
        )
        if stop():
            trial.study.stop()  # no new trial; the running ones stop at their next poll
        for key in RESULT_KEYS:
            trial.set_user_attr(key, _plain(getattr(res, key)))
        trial.set_user_attr("reason", res.reason)
        if res.state == PRUNED:
            raise optuna.TrialPruned(res.reason)
        if res.state == FAIL:
            raise TrialFailed(res.reason)
        values = objective_values(opts, res)
        return values if len(values) > 1 else values[0]

    def stop_if_asked(study: optuna.Study, _trial) -> None:  # Ctrl-C during a trial's tell
        if stop():
            study.stop()

    lines = TrialLines(opts, fixed)

    def say(_study: optuna.Study, t: optuna.trial.FrozenTrial) -> None:
        if t.user_attrs.get("reason") == INTERRUPTED:  # never started: Ctrl-C came first
            return
        res = {key: t.user_attrs.get(key) for key in (*RESULT_KEYS, "reason")}
        seconds = t.duration.total_seconds() if t.duration is not None else 0.0
        lines.trial_ended(t.number, t.state.name, t.params, res, seconds)

    _quiet_trial_failures()
    try:
        if not stop():
            study.optimize(
                objective,
                n_trials=opts.trials,
                n_jobs=opts.jobs,
                catch=(TrialFailed,),
                callbacks=[say, stop_if_asked],
            )
    finally:  # also on Ctrl-C: the study so far is on disk, and --resume continues it
        lines.close()
        rows = optuna_rows(study, space)
        write_outputs(opts, fixed, space, rows)
    return rows


# fixed settings a resumed sweep may change: none touches a trial's result (a second machine
# joining a --storage study may keep its data elsewhere)
SWEEP_RESUME_MAY_CHANGE = frozenset(
    {
        "progress",
        "metrics_port",
        "metrics_host",
        "metrics_per_rank",
        "data_dir",
        "tensorboard",
        "collective_timeout",
        "max_restarts",
    }
)


def _setting(key: str, fixed: dict[str, Any]) -> str:
    # the trials' --backend is --dist-backend on `autok sweep`
    name = "--dist-backend" if key == "backend" else flag(key)
    return f"{name} {fixed[key]}" if key in fixed else f"no {name}"


def _plain(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def optuna_rows(study, space: list[Dim]) -> list[dict]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                **{d.name: t.params.get(d.name) for d in space},
                **{key: attrs.get(key, attrs.get(OLD_NAMES.get(key, ""))) for key in RESULT_KEYS},
                "run_dir": attrs.get("run_dir", ""),
                "reason": attrs.get("reason", ""),
            }
        )
    return rows


# ----- outputs ---------------------------------------------------------------------------------


def _finished(rows: list[dict]) -> list[dict]:
    return [
        r
        for r in rows
        if r["state"] == COMPLETE
        and r["peak_test_metric"] is not None
        and r["wall_seconds"] is not None
    ]


def best_row(opts: SweepOptions, rows: list[dict]) -> dict | None:
    done = _finished(rows)
    if not done:
        return None
    if opts.objective == "time-to-target":
        reached = [r for r in done if r["time_to_target"] is not None]
        if reached:
            return min(reached, key=lambda r: r["time_to_target"])
    # pareto: the best-scoring point of the front (ties: the faster); metric: the same
    return max(done, key=lambda r: (oriented(opts, r["peak_test_metric"]), -r["wall_seconds"]))


def write_outputs(opts: SweepOptions, fixed: dict, space: list[Dim], rows: list[dict]) -> None:
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    # A reason is an error's text: it may quote a URL (a Ray address, a database) with a password.
    rows = [{**r, "reason": redact(str(r.get("reason") or ""))} for r in rows]
    columns = [
        "number",
        "state",
        *[d.name for d in space],
        *RESULT_KEYS,
        "run_dir",
        "reason",
    ]
    with open(out / "trials.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    done = _finished(rows)
    front = pareto_front([(oriented(opts, r["peak_test_metric"]), r["wall_seconds"]) for r in done])
    with open(out / "pareto.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(done[i] for i in front)
    plot_rows = [
        {**r, "sync_period": r.get("sync_period") or fixed.get("sync_period") or 4} for r in done
    ]
    plot_front(plot_rows, front, out / "pareto.png", opts.metric_name)
    best = best_row(opts, rows)
    if best is not None:
        # a conditional setting its trial did not read was not drawn (None): left out
        drawn = {
            d.name: best[d.name]
            for d in space
            if best[d.name] is not None or d.name not in CONDITIONAL
        }
        config = {k: _plain(v) for k, v in trial_settings(fixed, drawn).items() if k != "out"}
        # the K the trial started at, its floor and its faster-link check, pinned: a default
        # that moves would not rerun it (its settings ran, so they validate; kept as drawn if not)
        with contextlib.suppress(ConfigError):
            ran = load_config({}, {**config, "out": None})
            config.setdefault("sync_period", ran.sync_period)
            if ran.k_floor is not None:
                config.setdefault("k_floor", ran.k_floor)
            if reads(ran.policy, "link_drop"):
                config.setdefault("link_drop", ran.link_drop)
        (out / "best.yaml").write_text(
            f"# best trial {best['number']} of {out}: best test {opts.metric_name} "
            f"{best['peak_test_metric']:.4g}, {best['wall_seconds']:.1f} s of training\n"
            f"# run it: autok train --config {out / 'best.yaml'}\n"
            + yaml.safe_dump(config, sort_keys=True)
        )


def table(
    rows: list[dict], space: list[Dim], limit: int = 15, opts: SweepOptions | None = None
) -> str:
    opts = opts or SweepOptions()
    done = sorted(_finished(rows), key=lambda r: -oriented(opts, r["peak_test_metric"]))
    head = ["#", "state", *[d.name for d in space], f"peak {opts.metric_name}"]
    head += ["train s", "total s"]
    # a column as wide as its header ("peak accuracy", "peak perplexity") or 12
    widths = [max(12, len(h)) for h in head]
    lines = ["  ".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True))]
    for r in done[:limit] + [r for r in rows if r["state"] != COMPLETE][:limit]:
        cells = [str(r["number"]), r["state"]]
        for d in space:
            v = r[d.name]  # None: not drawn (a setting the trial does not read) or null
            cells.append(f"{v:.4g}" if isinstance(v, float) else "-" if v is None else str(v))
        value, wall, total = r["peak_test_metric"], r["wall_seconds"], r.get("total_seconds")
        cells += [f"{value:.4g}" if value is not None else "-", f"{wall:.1f}" if wall else "-"]
        cells.append(f"{total:.1f}" if total else "-")
        lines.append("  ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))
    return "\n".join(lines)
