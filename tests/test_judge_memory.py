"""The judge's memory: the shared arena, the declared need and the kernel's allowance, who is blamed when the GPU
runs out, and real gradings that record the plan and fail the right way when the judge itself runs out.

GPU behaviour (the plan measured on a real device, a kernel that hogs the GPU) is in tests/test_judge_gpu.py and
the fixture tests/kernels/gpu_memory_hog.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_judge import KERNELS, ROOT, needs_sandbox

from mkb.judge import grade
from mkb.judge.candidate import guards
from mkb.judge.referee import memory, timing
from mkb.judge.referee.transport import Arena, copy_in
from mkb.judge.referee.verdict import charged
from mkb.problems import parse_problem
from mkb.records import Status

GIB = 1 << 30


def _arena() -> Arena:
    return Arena(lambda n: torch.empty(n, dtype=torch.uint8).untyped_storage())


def _draw(seed: int) -> list:
    """Inputs shaped like a problem's: a weight, a view of it, an index tensor, a scalar."""
    torch.manual_seed(seed)
    w = torch.randn(6, 8)
    return [w, w[2:4], torch.randint(0, 6, (5,)), 0.5, w.t()]


def test_shared_copies_keep_the_draws_values_views_and_aliasing():
    inputs = _draw(0)
    shared, storages = copy_in(inputs, _arena())
    assert all(torch.equal(a, b) for a, b in zip(shared[:3], inputs[:3])) and shared[3] == 0.5
    assert shared[1].storage_offset() == inputs[1].storage_offset() and shared[4].stride() == inputs[4].stride()
    assert shared[0].untyped_storage().data_ptr() == shared[1].untyped_storage().data_ptr()  # still one storage
    assert shared[0].untyped_storage().data_ptr() != inputs[0].untyped_storage().data_ptr()  # a copy, not the draw
    assert len(storages) == 2
    shared[1].fill_(7.0)
    assert not torch.equal(shared[0], inputs[0]) and torch.equal(inputs[0], _draw(0)[0])  # the draw stays pristine


def test_the_arena_reuses_its_storages_so_many_draws_cost_one_set():
    arena = _arena()
    for seed in range(12):
        shared, storages = copy_in(_draw(seed), arena)
        assert torch.equal(shared[0], _draw(seed)[0])
        arena.give_back(storages)
    assert len(arena.made) == 2 and arena.nbytes == 6 * 8 * 4 + 5 * 8


def test_the_arena_lends_the_smallest_idle_storage_that_fits_and_makes_one_when_none_does():
    arena = _arena()
    big, small = arena.lend(1000), arena.lend(10)
    arena.give_back([big, small])
    assert arena.lend(8) is small and arena.lend(500) is big
    assert arena.lend(2000).nbytes() == 2000 and len(arena.made) == 3


def test_a_storage_held_by_a_draw_is_not_lent_twice():
    arena = _arena()
    _, held = copy_in(_draw(1), arena)
    _, other = copy_in(_draw(2), arena)
    assert not {s.data_ptr() for s in held} & {s.data_ptr() for s in other}


def test_the_need_covers_a_draw_beside_the_shared_sets_and_headroom():
    need = memory.need(draw_peak=80 * GIB, input_set=14 * GIB, answers=1 * GIB, pool_sets=1)
    measured = 94 * GIB + 1 * GIB + memory.JUDGING_MARGIN_BYTES
    assert need == measured + int(memory.HEADROOM_FRACTION * measured)
    small = memory.need(draw_peak=64 << 20, input_set=32 << 20, answers=1 << 20, pool_sets=4)  # beside 4 pool sets
    assert small == (64 << 20) + 4 * (32 << 20) + (1 << 20) + memory.JUDGING_MARGIN_BYTES + memory.HEADROOM_MIN_BYTES


def _budget() -> memory.Budget:
    """p45-like: 14 GiB inputs, an 80 GiB first-draw peak, on a 140 GiB device with 2 GiB of CUDA contexts."""
    before = memory.Reading(total=140 * GIB, used=2 * GIB, reserved=0)
    after = memory.Reading(total=140 * GIB, used=17 * GIB, reserved=15 * GIB)
    return memory.plan(before, after, peak=80 * GIB, input_set=14 * GIB, answers=1 * GIB, pool_sets=1)


def test_the_allowance_is_the_device_less_the_floor_and_the_judges_claim():
    budget = _budget()
    assert budget.floor == 2 * GIB and budget.claim == memory.need(80 * GIB, 14 * GIB, 1 * GIB, 1)
    assert budget.allowance == 140 * GIB - 2 * GIB - budget.claim
    assert budget.others(memory.Reading(140 * GIB, used=60 * GIB, reserved=40 * GIB)) == 18 * GIB


@pytest.mark.parametrize("kernel_gib, alive, charged_to_kernel, words", [
    (40, True, True, "more than their allowance"),      # a kernel that keeps memory between calls
    (5, True, False, "inside their allowance"),          # the judge needed more than it claimed
    (40, False, False, "after the kernel's processes had ended"),  # eager phase: nothing of the kernel is left
])
def test_blame_follows_the_allowance_fixed_before_the_kernel_loaded(kernel_gib, alive, charged_to_kernel, words):
    budget = _budget()
    judge = 140 * GIB - 2 * GIB - kernel_gib * GIB  # the device is full
    kernel, message = memory.blame(budget, memory.Reading(140 * GIB, 140 * GIB, judge), alive, "correctness")
    assert kernel is charged_to_kernel and words in message and f"held {kernel_gib}.0 GiB" in message


def test_only_a_proven_judge_failure_stays_infra_error_once_the_kernel_loaded():
    assert charged(Status.INFRA_ERROR, "x", kernel_loaded=True)[0] == Status.CRASHED
    assert charged(Status.INFRA_ERROR, "x", kernel_loaded=True, proven=True)[0] == Status.INFRA_ERROR
    assert charged(Status.INFRA_ERROR, "x", kernel_loaded=False)[0] == Status.INFRA_ERROR


@pytest.mark.parametrize("set_bytes, free_bytes, sets", [
    (14 * GIB, 120 * GIB, 1),       # p45: one set, whatever is free
    (1 * GIB, 120 * GIB, 4),        # four sets within the 8 GiB budget
    (3 * GIB, 120 * GIB, 2),
    (1 * GIB, 8 * GIB, 2),          # a quarter of what is free
    (1 * GIB, 0, 1),                # always one
])
def test_the_timing_pool_fits_its_budget(set_bytes, free_bytes, sets):
    assert timing.pool_size(set_bytes, free_bytes) == sets


def test_the_harness_copies_small_inputs_for_its_mutation_report_but_not_large_ones():
    small = [torch.ones(4)]
    assert len(guards.snapshot(small)) == 1
    large = [torch.zeros(1).expand(guards.SNAPSHOT_LIMIT_BYTES // 4 + 1)]  # counts as 1 GiB, holds 4 bytes
    assert guards.snapshot(large) == [] and guards.mutated(large, []) == []


@needs_sandbox
def test_a_grading_records_the_accounting_and_makes_its_first_draw_before_the_kernel_loads():
    info = parse_problem(ROOT / "problems/mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b.py")
    record = grade(info, KERNELS / "valid_tirx_p28.py", "tirx", device="cpu", scale="smoke", timeout_s=120)
    assert record.status == Status.PASSED, record.message
    import importlib.util

    spec = importlib.util.spec_from_file_location("p28", info.path)
    problem = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(problem)
    inputs = problem.make_inputs(device="cpu", scale="smoke")
    outputs = problem.reference(*inputs)
    used = record.details["memory"]
    assert used["input_set_bytes"] == sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))
    assert used["answer_bytes"] == sum(t.numel() * t.element_size() for t in outputs)
    assert used["anchor_answer_bytes"] == sum(t.numel() * 8 for t in outputs)
    assert list(record.details["phases_s"])[:3] == ["startup", "first draw", "import"]


def _oom_problem(tmp_path: Path, on_call: int) -> Path:
    """p28 whose make_inputs raises CUDA's out-of-memory error on its on_call-th call in the referee."""
    source = (ROOT / "problems/mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b.py").read_text()
    source = source.replace("def make_inputs(", "_CALLS = [0]\n\n\ndef _make_inputs(", 1)
    source += (f"\n\ndef make_inputs(device=\"cuda\", scale=\"full\"):\n    _CALLS[0] += 1\n"
               f"    if _CALLS[0] == {on_call}:\n"
               f"        raise torch.OutOfMemoryError(\"CUDA out of memory. Tried to allocate 20.00 GiB\")\n"
               f"    return _make_inputs(device, scale)\n")
    path = tmp_path / "mlp_norm" / "28_fused_add_rmsnorm_h4096_llama31_8b.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    return path


@needs_sandbox
def test_the_judge_running_out_before_the_kernel_loads_is_infra_error(tmp_path):
    record = grade(parse_problem(_oom_problem(tmp_path, 1)), KERNELS / "valid_tirx_p28.py", "tirx", device="cpu",
                   scale="smoke", timeout_s=120)
    assert record.status == Status.INFRA_ERROR
    assert "ran out of GPU memory preparing the first draw, before kernel.py was imported" in record.message


@needs_sandbox
def test_an_out_of_memory_the_referee_cannot_attribute_stays_charged(tmp_path):
    """On CPU there is no device to read: a trusted failure after kernel.py loaded keeps the #26 rule (crashed)."""
    record = grade(parse_problem(_oom_problem(tmp_path, 3)), KERNELS / "valid_tirx_p28.py", "tirx", device="cpu",
                   scale="smoke", timeout_s=120)
    assert record.status == Status.CRASHED and "OutOfMemoryError" in record.message


def test_the_tracer_counts_live_and_peak_bytes_by_storage():
    from mkb.judge.footprint import Tracer

    tracer = Tracer()
    with torch.no_grad(), tracer:
        a = torch.empty(1000)
        b = a * 2
        del a
        view = b.view(10, 100)  # no new storage
        d = torch.empty(2000)
    assert tracer.peak == 4000 + 4000 + 8000 - 4000 and tracer.live == 4000 + 8000
    del b, view, d
    assert tracer.live == 0


def test_big_tensors_are_counted_at_full_size_without_being_made():
    from mkb.judge.footprint import BIG_BYTES, Tracer, Untraceable

    tracer = Tracer()
    with torch.no_grad(), tracer:
        big = torch.randn(BIG_BYTES // 2 + 1, dtype=torch.bfloat16)  # 1 GiB and a bit: meta
        wide = big.double()
        assert big.is_meta and wide.is_meta
        with pytest.raises(Untraceable):
            wide.sum().item()
    assert tracer.peak == big.untyped_storage().nbytes() * 5 + 8  # and the float64 sum that .item() needed


def test_a_traced_draw_matches_the_real_one():
    from mkb.judge import footprint
    from mkb.problems import catalog_for, resolve

    info = resolve("p28", catalog_for(ROOT / "problems"))
    found = footprint.measure(info, scale="smoke")
    problem = __import__("mkb.problems", fromlist=["load_module"]).load_module(info)
    torch.manual_seed(0)
    inputs = problem.make_inputs(device="cpu", scale="smoke")
    outputs = problem.reference(*inputs)
    assert found.input_set == sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))
    assert (found.answer, found.anchor_answer) == (sum(t.nbytes for t in outputs), sum(t.numel() * 8 for t in outputs))
    assert found.draw_peak >= found.input_set + 4 * found.input_set // 2  # the bf16 inputs' float64 copies


def test_p45_at_full_scale_needs_most_of_an_h200_for_the_judge():
    """The capacity-factor MoE: 14.2 GiB of bf16 inputs whose float64 anchor copies alone take 56.6 GiB."""
    from mkb.judge import footprint
    from mkb.problems import catalog_for, resolve

    found = footprint.measure(resolve("p45", catalog_for(ROOT / "problems")))
    weights = 3 * 160 * 6144 * 2560 * 2
    selected = 8192 * 160 * 8  # the top-8 ids are a view of the whole argsort: its storage is what is shared
    assert found.input_set == weights + 8192 * 6144 * 2 + selected + 8192 * 8 * 2
    assert found.anchor_peak >= found.input_set + 4 * weights
    h200 = int(139.8 * GIB)
    assert 100 * GIB < found.need(h200 - 2 * GIB, h200) < h200 - 2 * GIB  # it fits, leaving a kernel little between calls
