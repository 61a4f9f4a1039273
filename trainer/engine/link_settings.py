"""The link emulator's settings and the clock every recorded time comes from (docs/design.md
§5, §4; trainer/engine/link.py, trainer/engine/clock.py), and the link they resolve to. Whether a
schedule and a profile agree is checked by SyncOptions' validator (trainer/engine/options.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autok.trainer.engine.about import GROUPS, about
from autok.trainer.engine.link import (
    PROFILES,
    LinkProfile,
    LinkSchedule,
    parse_schedule,
    resolve_profile,
    static_schedule,
)

MODEL_BYTES_MAX = 2**44  # --model-bytes: 16 TiB
_LINK = GROUPS[2]
_LINK_HELP = "emulated network: " + ", ".join(
    f"{n} ({p.rtt_ms:g} ms RTT, {p.bandwidth_gbps:g} Gbit/s)" if n != "none" else "none (no delay)"
    for n, p in PROFILES.items()
)


class LinkSettings(BaseModel):
    """--link and its overrides, --link-schedule, --clock, --compute-ms, --model-bytes."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # --- link emulator
    # the library's default: no emulated network (docs/design.md §3); `autok train` studies the
    # emulated WAN by default (TrainConfig overrides it)
    link: str = Field("none", description=_LINK_HELP, json_schema_extra=about(_LINK))
    link_rtt_ms: float | None = Field(
        None,
        ge=0.0,
        le=60_000.0,
        description="override the link's round-trip time, ms (default: the --link profile's)",
        json_schema_extra=about(
            _LINK, too_high="a minute per round trip; no link to emulate is slower"
        ),
    )
    link_bandwidth_gbps: float | None = Field(
        None,
        ge=1e-6,
        description="override the link's bandwidth, Gbit/s (default: the --link profile's)",
        json_schema_extra=about(_LINK, too_low="below 1 kbit/s one collective would take hours"),
    )
    link_jitter_ms: float | None = Field(
        None,
        ge=0.0,
        le=60_000.0,
        description="uniform extra delay per collective in [0, J] ms, seeded (default: 0)",
        json_schema_extra=about(
            _LINK, too_high="a minute of jitter per collective; no link to emulate is slower"
        ),
    )
    link_schedule: str | None = Field(
        None,
        max_length=2000,
        description="a link that changes during the run: PROFILE,PROFILE@epoch=N,... or "
        "@step=N (epochs and steps counted from 0), e.g. lan,wan@epoch=2,lan@epoch=4; replaces "
        "--link (default: unset)",
        json_schema_extra=about(_LINK),
    )
    # --- the clock every recorded time comes from (trainer/engine/clock.py; docs/design.md §4)
    clock: Literal["wall", "virtual"] = Field(
        "wall",
        description="where recorded times come from: wall (measured; the link emulator sleeps) "
        "or virtual (modelled from --compute-ms and the link model; nothing sleeps, and a seed "
        "gives the same records on any machine)",
        json_schema_extra=about(_LINK),
    )
    compute_ms: float | None = Field(
        None,
        gt=0.0,
        le=60_000.0,
        description="virtual: the compute of one optimizer step, ms (plus any straggler delay) "
        "(default: unset)",
        json_schema_extra=about(
            _LINK,
            too_high="a minute per step; no model to emulate is slower",
            read_only_under=("clock", frozenset({"virtual"}), "the wall clock measures compute"),
        ),
    )
    model_bytes: int | None = Field(
        None,
        ge=1,
        le=MODEL_BYTES_MAX,
        description="virtual: book every collective as if the model had this many parameter "
        "bytes (default: the model's own)",
        json_schema_extra=about(
            _LINK,
            too_high="16 TiB of parameters is beyond any model",
            read_only_under=(
                "clock",
                frozenset({"virtual"}),
                "the wall clock's link moves real bytes",
            ),
        ),
    )

    @property
    def link_profile(self) -> LinkProfile:
        """The profile the run starts on (with a schedule: its first)."""
        return resolve_profile(
            self.link, self.link_rtt_ms, self.link_bandwidth_gbps, self.link_jitter_ms
        )

    @property
    def link_plan(self) -> LinkSchedule:
        """The link over the whole run: the schedule, or the one profile throughout."""
        if self.link_schedule is not None:
            return parse_schedule(self.link_schedule)
        return static_schedule(self.link_profile)

    @property
    def link_name(self) -> str:
        """How records and labels name the link: the profile, or the schedule's text."""
        return self.link_plan.text if self.link_schedule is not None else self.link_profile.name
