"""How many CPUs this process may actually use: the default for `--threads`.

`os.cpu_count()` (and torch's default) counts the machine's cores, but on a cluster node or in a
container a job is allowed far fewer: `taskset`/cpusets restrict the affinity mask, a cgroup
quota (`cpu.max`, Docker's `--cpus`, systemd's CPUQuota) caps CPU time, and schedulers tell the
job its share (`SLURM_CPUS_PER_TASK`, Grid Engine's `NSLOTS`, Snakemake's and others'
`OMP_NUM_THREADS`). Running more threads than that oversubscribes the allowance, and a speed
comparison made that way mostly measures contention. The smallest of these limits wins, and an
explicit thread count is clamped to it (a huge one would make the OpenMP runtime fail to create
its threads).

The variables are checked before torch is imported (`cpu_env_warnings`): libgomp and MKL read
OMP_NUM_THREADS and MKL_NUM_THREADS then, and libgomp prints its own raw line for a malformed
one, so EvSpark removes it and says why in its own words instead.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from .cgroups import PROC_CGROUP, ROOT, cgroup_dirs, read_text

#: environment variables through which a scheduler or workflow manager states a job's CPUs
CPU_ENV = ("SLURM_CPUS_PER_TASK", "NSLOTS", "OMP_NUM_THREADS")
#: the thread counts the OpenMP runtime (libgomp) and MKL read when torch is imported
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

_SPACE = "[ \t\n\v\f\r]*"
_UNSIGNED = _SPACE + r"\+?([0-9]+)" + _SPACE
_FORMS = {
    # libgomp: positive integers, comma-separated (one per nesting level), spaces around each
    "OMP_NUM_THREADS": re.compile(f"{_UNSIGNED}(?:,{_UNSIGNED})*"),
    "MKL_NUM_THREADS": re.compile(_UNSIGNED),
}
_SCHEDULER_FORM = re.compile(r"\s*([0-9]+)(?:\(x[0-9]+\))?(?:,[0-9]+(?:\(x[0-9]+\))?)*\s*")
"""SLURM_CPUS_PER_TASK and NSLOTS: a count; SLURM's "4(x2)" (repeated counts) is read too."""
_LARGEST = 2 ** 63 - 1  # libgomp refuses a count that does not fit a signed long


@dataclass(frozen=True)
class CpuLimit:
    """The CPUs this process may use and the source that set the limit (for the summary)."""

    count: int
    source: str  # "affinity", "cgroup quota", "SLURM_CPUS_PER_TASK", ...


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (`taskset`, cpusets); the core count elsewhere."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def _quota_v2(text: str | None) -> float | None:
    """`cpu.max` holds "QUOTA PERIOD" in microseconds, or "max PERIOD" for no limit."""
    parts = (text or "").split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _quota_v1(quota: str | None, period: str | None) -> float | None:
    """cgroup v1: cpu.cfs_quota_us (-1 for no limit) over cpu.cfs_period_us."""
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def cgroup_cpus(proc_cgroup: Path = PROC_CGROUP, root: Path = ROOT) -> float | None:
    """The CPU-time quota of this process's cgroups (v2 `cpu.max` or v1 CFS, at any level of
    its own cgroup's path: cgroups.py), in CPUs; None when there is none (or no cgroups: not
    Linux)."""
    quotas: list[float] = []
    for version, d in cgroup_dirs("cpu", proc_cgroup, root):
        q = (_quota_v2(read_text(d / "cpu.max")) if version == 2 else
             _quota_v1(read_text(d / "cpu.cfs_quota_us"), read_text(d / "cpu.cfs_period_us")))
        if q is not None:
            quotas.append(q)
    return min(quotas) if quotas else None


def _env_cpus(environ: Mapping[str, str], name: str) -> int | None:
    """A positive integer from the environment (SLURM may write "4(x2)" for repeated counts)."""
    raw = environ.get(name, "").split("(")[0].split(",")[0].strip()
    try:
        n = int(raw)
    except ValueError:
        return None
    return n if n > 0 else None


def _well_formed(name: str, value: str) -> bool:
    """Whether `value` of variable `name` is one its reader accepts: every count a positive
    integer that fits a signed long, in the variable's form (`_FORMS`, `_SCHEDULER_FORM`)."""
    form = _FORMS.get(name, _SCHEDULER_FORM)
    if form.fullmatch(value) is None:
        return False
    if name in _FORMS:  # every count of the list
        counts = re.findall(r"[0-9]+", value)
    else:  # the first count, which `_env_cpus` reads
        counts = [value.split("(")[0].split(",")[0]]
    return all(0 < int(c) <= _LARGEST for c in counts)


def cpu_env_warnings(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Why each malformed CPU variable is ignored, one message each. A bad OMP_NUM_THREADS or
    MKL_NUM_THREADS is removed from `environ` (default os.environ), so that libgomp, reading it
    when torch is imported, does not print its own raw line; a bad SLURM_CPUS_PER_TASK or NSLOTS
    is left for other programs and only ignored here (`usable_cpus`)."""
    env = os.environ if environ is None else environ
    out = []
    for name in dict.fromkeys(CPU_ENV + THREAD_ENV):
        value = env.get(name)
        if value is None or _well_formed(name, value):
            continue
        if name in THREAD_ENV:
            del env[name]
        shown = value if len(value) <= 40 else value[:40] + "..."
        out.append(f"{name}={shown!r} is not a positive integer; ignored")
    return out


_PENDING: list[str] | None = None
"""The warnings of this process's environment, found once (at the package's import, before
torch is), until a front end shows them."""


def screen_cpu_env() -> None:
    """Check os.environ's CPU variables once per process (`cpu_env_warnings`), keeping the
    warnings until `take_cpu_env_warnings`."""
    global _PENDING
    if _PENDING is None:
        _PENDING = cpu_env_warnings()


def take_cpu_env_warnings() -> list[str]:
    """The environment's warnings not shown yet (each is shown once per process)."""
    screen_cpu_env()
    assert _PENDING is not None
    taken = list(_PENDING)
    _PENDING.clear()
    return taken


def usable_cpus(environ: Mapping[str, str] | None = None,
                proc_cgroup: Path = PROC_CGROUP, root: Path = ROOT) -> CpuLimit:
    """The smallest of: the affinity mask, the cgroup quota (rounded up: 1.5 CPUs of quota
    keep two threads busy part of the time), and the CPU counts in CPU_ENV."""
    env = os.environ if environ is None else environ
    best = CpuLimit(affinity_cpus(), "affinity")
    quota = cgroup_cpus(proc_cgroup, root)
    if quota is not None:
        n = max(1, math.ceil(quota - 1e-9))
        if n < best.count:
            best = CpuLimit(n, "cgroup quota")
    for name in CPU_ENV:
        n = _env_cpus(env, name)
        if n is not None and n < best.count:
            best = CpuLimit(n, name)
    return best


@dataclass(frozen=True)
class Threads:
    """The threads a run uses, where the number came from, and what the process may use."""

    count: int
    source: str  # "--threads" when the user chose, else the CpuLimit's source
    allowed: CpuLimit
    asked: int = 0  # the count the user asked for (0: none), before `clamp_threads`

    @property
    def clamped(self) -> bool:
        """The user asked for more threads than this process may use, and got fewer."""
        return self.asked > self.count

    def describe(self) -> str:
        """For the summary line: "4 threads (SLURM_CPUS_PER_TASK)"."""
        return f"{self.count} thread{'s' if self.count != 1 else ''} ({self.source})"


def clamp_threads(threads: int, allowed: CpuLimit | None = None) -> Threads:
    """The threads to run for a request of `threads` (0: the CPUs this process may use): never
    more than `allowed` (default `usable_cpus()`). More threads than CPUs only compete for the
    same cores, and a huge count makes the OpenMP runtime fail to create them (a crash)."""
    limit = usable_cpus() if allowed is None else allowed
    if threads <= 0:
        return Threads(limit.count, limit.source, limit)
    if threads > limit.count:
        return Threads(limit.count, limit.source, limit, asked=threads)
    return Threads(threads, "--threads", limit, asked=threads)
