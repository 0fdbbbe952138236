"""Argument types shared by the commands: a number within a range, parsed once, with one
kind of message (argparse prints it as `argument --flag: ...` and exits with status 2)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def number(what: str, low: float = -math.inf, high: float = math.inf, *,
           low_open: bool = False, whole: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number (a whole one with `whole`) in [low, high] (or
    (low, high] with `low_open`); `what` names it in the message."""
    if math.isinf(high):
        bounds = f"{'>' if low_open else '>='} {low:g}"
    else:
        bounds = f"in {'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {what}, got `{text}`") from None
        if not math.isfinite(value) or value < low or value > high or (low_open
                                                                       and value == low):
            raise argparse.ArgumentTypeError(f"{what} must be {bounds}, got {text}")
        return value

    return parse


positive = number("the value", 0.0, low_open=True)
fraction = number("the fraction", 0.0, 1.0)
mib = number("the cache size in MiB", 0.0)
drop_factor = number("the drop factor (of the uniform weight)", 0.0, 1.0, low_open=True)
positive_int = number("the count", 1, whole=True)
