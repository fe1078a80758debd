"""CPU placement while timing (mkb.judge.referee.cpus): topology parsing, exclusive claims, pinning."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from mkb.judge.referee import cpus


def fake_sysfs(root: Path, siblings: dict[int, str]) -> Path:
    """A /sys/devices/system/cpu tree whose cpuN/topology/thread_siblings_list are given."""
    for cpu, text in siblings.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(text + "\n")
    return root


SMT8 = {c: f"{c % 4},{c % 4 + 4}" for c in range(8)}  # 4 cores with 2 threads each: (0,4) (1,5) (2,6) (3,7)


@pytest.mark.parametrize("text, expected", [("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}), ("5", {5}), ("", set()),
                                            (None, set()), ("0,4\n", {0, 4})])
def test_parse_cpulist(text, expected):
    assert cpus.parse_cpulist(text) == expected


def test_physical_cores_group_siblings_and_drop_partly_allowed_cores(tmp_path):
    sys_cpu = fake_sysfs(tmp_path, SMT8)
    assert cpus.physical_cores(set(range(8)), sys_cpu) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # a cgroup that allows only one thread of core (3, 7) leaves that core out: its sibling is not ours
    assert cpus.physical_cores({0, 1, 4, 5, 3}, sys_cpu) == [(0, 4), (1, 5)]
    assert cpus.physical_cores({0, 1}, tmp_path / "missing") is None


def test_preference_puts_gpu_local_and_high_numbered_cores_first():
    cores = [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert cpus.preference(cores, set()) == [(3, 7), (2, 6), (1, 5), (0, 4)]
    assert cpus.preference(cores, {0, 4, 1, 5}) == [(1, 5), (0, 4), (3, 7), (2, 6)]


def test_gpu_local_cpus_reads_the_pci_device(tmp_path):
    (tmp_path / "0000:1b:00.0").mkdir()
    (tmp_path / "0000:1b:00.0" / "local_cpulist").write_text("0-3\n")
    assert cpus.gpu_local_cpus("00000000:1B:00.0", tmp_path) == {0, 1, 2, 3}
    assert cpus.gpu_local_cpus("0000:1b:00.0", tmp_path) == {0, 1, 2, 3}
    assert cpus.gpu_local_cpus("0000:99:00.0", tmp_path) == set()
    assert cpus.gpu_local_cpus(None, tmp_path) == set()


def _claim_in_child(lock_dir: str, sys_cpu: str, queue) -> None:
    with cpus.claimed(2, directory=Path(lock_dir), allowed=set(range(8)), sys_cpu=Path(sys_cpu)) as cores:
        queue.put(cores)


def test_claims_are_exclusive_across_processes_and_released_at_exit(tmp_path):
    sys_cpu, locks = fake_sysfs(tmp_path / "sys", SMT8), tmp_path / "locks"
    with cpus.claimed(2, directory=locks, allowed=set(range(8)), sys_cpu=sys_cpu) as mine:
        assert mine == [(3, 7), (2, 6)]
        queue = multiprocessing.get_context("spawn").Queue()
        child = multiprocessing.get_context("spawn").Process(target=_claim_in_child,
                                                             args=(str(locks), str(sys_cpu), queue))
        child.start()
        child.join(60)
        assert queue.get(timeout=5) is None  # only (1, 5) is free, and one core is always left over
        with cpus.claimed(1, directory=locks, allowed=set(range(8)), sys_cpu=sys_cpu) as one:
            assert one == [(1, 5)]
    with cpus.claimed(2, directory=locks, allowed=set(range(8)), sys_cpu=sys_cpu) as again:
        assert again == [(3, 7), (2, 6)]  # released when the block ended


def test_too_few_cores_pin_nothing(tmp_path):
    sys_cpu = fake_sysfs(tmp_path / "sys", {0: "0,1", 1: "0,1", 2: "2,3", 3: "2,3"})
    with cpus.claimed(2, directory=tmp_path / "locks", allowed={0, 1, 2, 3}, sys_cpu=sys_cpu) as cores:
        assert cores is None  # two cores, and one must stay free for everything else


def test_pinned_restores_the_affinity():
    before = os.sched_getaffinity(0)
    cpu = min(before)
    with cpus.pinned(cpu):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before
    with cpus.pinned(None):
        assert os.sched_getaffinity(0) == before


def test_an_unusable_lock_directory_pins_nothing(tmp_path):
    sys_cpu = fake_sysfs(tmp_path / "sys", SMT8)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with cpus.claimed(2, directory=blocker / "locks", allowed=set(range(8)), sys_cpu=sys_cpu) as cores:
        assert cores is None
