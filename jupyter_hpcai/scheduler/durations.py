"""Durations and times as the project writes them (a form's walltime, a job's time limit, its end): ``D-HH:MM:SS``
and ``YYYY-MM-DDTHH:MM:SS``, Slurm's formats, which another scheduler's implementation translates its own into."""

from __future__ import annotations

import time


def parse_duration(text: str) -> int | None:
    """A duration (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) in seconds; None for UNLIMITED."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = 0, parts[0], 0
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def later(when: str, seconds: int) -> str:
    """The time ``when`` (``YYYY-MM-DDTHH:MM:SS``) ``seconds`` later, in the same format; "" for none."""
    try:
        moved = time.mktime(time.strptime(when, "%Y-%m-%dT%H:%M:%S")) + seconds
    except ValueError:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(moved))


def seconds_until(when: str) -> int | None:
    """Seconds from now until ``when`` (``YYYY-MM-DDTHH:MM:SS``, local time; negative once past); None for none."""
    try:
        return int(time.mktime(time.strptime(when, "%Y-%m-%dT%H:%M:%S")) - time.time())
    except ValueError:
        return None


def format_duration(seconds: int) -> str:
    """Seconds as ``D-HH:MM:SS`` (or ``HH:MM:SS`` under a day)."""
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text
