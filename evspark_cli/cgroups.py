"""This process's own cgroups: the folders that hold its CPU quota and memory limit.

A SLURM job, a container or a systemd unit limits a process through the cgroup it was placed
in, which `/proc/self/cgroup` names (one line per v1 hierarchy, `0::PATH` for v2), not through
the top of the hierarchy. In a container the mount point is often the process's own cgroup
while `/proc` shows the host's path, so every level of the path that exists under the mount is
read, from the process's own up to the root: a limit anywhere on the way up applies.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
ROOT = Path("/sys/fs/cgroup")

V1_MOUNTS = {"cpu": ("cpu", "cpu,cpuacct", "cpuacct,cpu"), "memory": ("memory",)}
"""Where a v1 controller's hierarchy is mounted under ROOT (the names systemd and Docker use)."""


def read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _levels(root: Path, path: str) -> list[Path]:
    """The cgroup folder of `path` under the mount `root` and each of its ancestors, deepest
    first (only those that exist)."""
    parts = [p for p in path.split("/") if p]
    dirs = [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()]


def cgroup_dirs(controller: str, proc_cgroup: Path = PROC_CGROUP,
                root: Path = ROOT) -> list[tuple[int, Path]]:
    """(version, folder) of every level of this process's cgroup for `controller` ("cpu",
    "memory"): v2 folders of the unified hierarchy, v1 folders of the controller's own."""
    found: list[tuple[int, Path]] = []
    for line in (read_text(proc_cgroup) or "").splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # cgroup v2 (unified hierarchy)
            for base in (root, root / "unified"):
                found.extend((2, d) for d in _levels(base, path))
        elif controller in controllers.split(","):
            for name in V1_MOUNTS.get(controller, (controller,)):
                found.extend((1, d) for d in _levels(root / name, path))
    return found


@dataclass(frozen=True)
class MemoryLimit:
    """A cgroup's memory limit and what its processes hold now (its working set: usage less the
    page cache the kernel would reclaim first, as container runtimes count it)."""

    limit: int
    used: int
    folder: Path

    @property
    def left(self) -> int:
        return max(self.limit - self.used, 0)


_V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
_V2_FILES = ("memory.max", "memory.current", "inactive_file")
NO_LIMIT = 1 << 60
"""A v1 limit at or above this is "no limit" (the kernel writes the largest page-aligned
number)."""


def _stat_value(folder: Path, key: str) -> int:
    for line in (read_text(folder / "memory.stat") or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def memory_limits(proc_cgroup: Path = PROC_CGROUP, root: Path = ROOT) -> list[MemoryLimit]:
    """The memory limits of every level of this process's cgroup (v1 and v2) that sets one."""
    out: list[MemoryLimit] = []
    for version, folder in cgroup_dirs("memory", proc_cgroup, root):
        limit_file, usage_file, inactive = _V2_FILES if version == 2 else _V1_FILES
        limit, usage = read_text(folder / limit_file), read_text(folder / usage_file)
        if not limit or not limit.isdigit() or int(limit) >= NO_LIMIT:
            continue  # "max" (v2), the v1 sentinel, or unreadable
        used = int(usage) if usage and usage.isdigit() else 0
        used = max(used - _stat_value(folder, inactive), 0)
        out.append(MemoryLimit(int(limit), used, folder))
    return out
