"""How many CPUs this process may actually use: the default for `--threads`.

`os.cpu_count()` (and torch's default) counts the machine's cores, but on a cluster node or in a
container a job is allowed far fewer: `taskset`/cpusets restrict the affinity mask, a cgroup
quota (`cpu.max`, Docker's `--cpus`, systemd's CPUQuota) caps CPU time, and schedulers tell the
job its share (`SLURM_CPUS_PER_TASK`, Grid Engine's `NSLOTS`, Snakemake's and others'
`OMP_NUM_THREADS`). Running more threads than that oversubscribes the allowance, and a speed
comparison made that way mostly measures contention. The smallest of these limits wins.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: environment variables through which a scheduler or workflow manager states a job's CPUs
CPU_ENV = ("SLURM_CPUS_PER_TASK", "NSLOTS", "OMP_NUM_THREADS")


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


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


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


def _levels(root: Path, path: str) -> list[Path]:
    """The cgroup folder of this process and its ancestors under a mount point. In a container
    the mount is often the process's own cgroup while /proc shows the host's path, so every
    level that exists is read; a quota anywhere on the way up applies."""
    parts = [p for p in path.split("/") if p]
    dirs = [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()]


def cgroup_cpus(proc_cgroup: Path = Path("/proc/self/cgroup"),
                root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU-time quota of this process's cgroups (v2 `cpu.max` or v1 CFS), in CPUs; None
    when there is none (or no cgroups: not Linux)."""
    lines = (_read(proc_cgroup) or "").splitlines()
    quotas: list[float] = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # cgroup v2 (unified hierarchy)
            for base in (root, root / "unified"):
                for d in _levels(base, path):
                    q = _quota_v2(_read(d / "cpu.max"))
                    if q is not None:
                        quotas.append(q)
        elif "cpu" in controllers.split(","):  # cgroup v1
            for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                for d in _levels(root / name, path):
                    q = _quota_v1(_read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us"))
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


def usable_cpus(environ: Mapping[str, str] | None = None,
                proc_cgroup: Path = Path("/proc/self/cgroup"),
                root: Path = Path("/sys/fs/cgroup")) -> CpuLimit:
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

    @property
    def oversubscribed(self) -> bool:
        """More threads than CPUs this process may use: they compete for the same cores."""
        return self.count > self.allowed.count

    def describe(self) -> str:
        """For the summary line: "4 threads (SLURM_CPUS_PER_TASK)"."""
        return f"{self.count} thread{'s' if self.count != 1 else ''} ({self.source})"
