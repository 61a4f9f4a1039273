import math


def cosine_lr(t: int, total: int, peak: float) -> float:
    return 0.5 * peak * (1 + math.cos(math.pi * t / total))
