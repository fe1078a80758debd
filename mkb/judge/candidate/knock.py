"""The sealed core of the DSL hooks: each genuine DSL call counted and reported, observed or knocked out.

make_core() builds it once, before kernel.py is imported, as closures over what it uses (torch's and the
standard library's functions, captured then). Nothing but the public hooks' default arguments and the
import watcher's refer to it, and the seal refuses the candidate __defaults__, frames and the garbage
collector, so its functions are unreachable; their code looks up no global name (a test disassembles
them), so replacing names in a module's dict later changes nothing here.

A correctness draw's mode reaches the harness as the command's flag (wire.py) and the harness hands it to
the core for the duration of solve() (core["draw"]); only the core's closures hold it then. In every mode a
genuine call runs the same way: its tensor arguments are copied, the call runs, and the arguments whose bits
it changed (with, after the observed draw, those it changed when observed) are its outputs. Then:

- OBSERVE (the first draw): report which tensor arguments the call wrote, their scale, its time.
- KNOCK_NAN, KNOCK_NOISE: overwrite the call's outputs in place: with NaN (bitwise-not for integers), or with
  finite noise at the scale they have just been written with, which neither a NaN check, `0 * x` nor a
  range check can tell from an answer (and which no earlier call can steer).
- NORMAL (after the observed draw): the same overwrites (NaN or noise, at random) on scratch copies, so that a
  call runs the same code, and costs the same, either way.

A knocked-out call has run, so nothing it does besides its outputs (a return value, a write outside the
tensors it was given, a callback, the time it takes) tells it from a real one. Only where the knock-out
cannot see into an argument (an object that is neither a tensor nor a plain number: CuTe DSL's own tensor
wrappers, a stream) is a CuTe DSL call skipped instead: it then waits the time it took when observed and
overwrites what it wrote then. TIRx calls always run: their buffers always arrive as DLPack tensors.

Every genuine call of a draw is reported ("call" evidence) alike in every mode: the referee, which chose
the mode, knows which draw was knocked out. Only plain torch tensors are observed or overwritten; a
torch dispatch or function mode active during a DSL call is refused in every mode.
"""

from __future__ import annotations

import operator
import os
import time
from typing import Any, Callable

import torch

NORMAL, OBSERVE, KNOCK_NAN, KNOCK_NOISE = 0, 1, 2, 3
"""Flags of a solve command (wire.py): the draw's mode."""


MODE, PLAN, DEPTH, COMPILING = range(4)
"""A draw's state is a plain list [mode, plan, depth, compiling]: built-in types only, because a candidate
can replace any attribute of any class it reaches (class attributes are not audited)."""


def new_state(mode: int, plan) -> list:
    """A draw's state: mode (a flag value) and the referee's plan, key -> {"args", "stats", "s"}."""
    return [mode if mode in (1, 2, 3) else 0, plan if type(plan) is dict else {}, 0, 0]


def make_core(emit: Callable[[dict], None], finding: Callable[[str], None], probe: Callable[[], str]) -> dict:
    """The core (a dict of closures), reporting through emit and finding.

    probe() describes the dispatcher (escape.make_dispatcher_probe): it must read as it did when core["arm"]() was
    last called (by the harness, before kernel.py is imported) whenever the core writes a poison, or a Python
    kernel on an operator would see the writes.

    The harness hands it each draw's state with core["draw"](state) before solve() and core["draw"](None)
    after: the state then lives only in a cell of these closures, which nothing the candidate reaches
    refers to, and a call outside a draw (the timed and profiled calls) costs a lookup, not a search.
    """
    perf, urandom = time.perf_counter, os.urandom
    normal, observe, knock_nan, knock_noise = NORMAL, OBSERVE, KNOCK_NAN, KNOCK_NOISE
    i_mode, i_plan, i_depth, i_compiling = MODE, PLAN, DEPTH, COMPILING
    Tensor, empty, generator_of, from_dlpack = torch.Tensor, torch.empty, torch.Generator, torch.from_dlpack
    no_grad, record_function = torch.no_grad, torch.autograd.profiler.record_function
    profiling, dispatch_depth = torch.autograd._profiler_enabled, torch._C._len_torch_dispatch_stack
    function_depth = torch._C._len_torch_function_stack
    f32, u8, nan, tbool = torch.float32, torch.uint8, float("nan"), torch.bool
    t_clone, t_equal, t_fill, t_copy = Tensor.clone, torch.equal, Tensor.fill_, Tensor.copy_
    t_view, t_reshape, t_contig, t_detach = Tensor.view, Tensor.reshape, Tensor.contiguous, Tensor.detach
    data_of = Tensor.data.__get__
    """An alias of a tensor's memory with a version counter of its own: the poison writes through it, because an
    in-place write bumps the autograd version counter (Tensor._version) that the candidate's tensor shares with its
    views, and a graded draw's poison (on a scratch copy) bumps nothing the candidate holds."""
    t_not, t_lnot, t_normal, t_clamp, t_random = (Tensor.bitwise_not_, Tensor.logical_not_, Tensor.normal_,
                                                  Tensor.clamp_, Tensor.random_)
    t_isfinite, t_float, t_mean, t_std, t_min, t_max, t_item, t_numel = (
        torch.isfinite, Tensor.double, Tensor.mean, Tensor.std, Tensor.min, Tensor.max, Tensor.item, Tensor.numel)
    t_lt, t_uniform, t_getitem, seed_of = Tensor.lt, Tensor.uniform_, Tensor.__getitem__, torch.Generator.manual_seed
    t_as_strided, t_offset, t_index_put, t_unsqueeze = (Tensor.as_strided, Tensor.storage_offset, Tensor.index_put_,
                                                        Tensor.unsqueeze)
    t_add, t_mul, t_unique, arange_, zeros_ = torch.add, torch.mul, torch.unique, torch.arange, torch.zeros
    i64 = torch.int64
    dtype_of = Tensor.dtype.__get__
    device_of = Tensor.device.__get__
    shape_of = Tensor.shape.__get__
    is_float = Tensor.is_floating_point
    is_complex = Tensor.is_complex
    type_, str_, int_, float_, len_, abs_, max_, min_, zip_ = type, str, int, float, len, abs, max, min, zip
    bool_, index_, isinstance_, sorted_ = bool, operator.index, isinstance, sorted
    dict_, list_, tuple_, enumerate_, hasattr_, id_ = dict, list, tuple, enumerate, hasattr, id
    Exception_, PermissionError_ = Exception, PermissionError
    plain_types = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device)
    signed_of = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    raw = set()
    for name in ("uint16", "uint32", "uint64", "float4_e2m1fn_x2", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16"):
        if hasattr(torch, name):
            raw.add(getattr(torch, name))
    """dtypes torch has (almost) no arithmetic for (no min, fill_ or bitwise_not_ on unsigned words; nothing on packed
    fp4 or bits): the knock-out reads and poisons them as the signed integers of their width (a view of the same
    memory), so that its poison cannot fail on them (a failing poison looked like a knock-out's evidence)."""
    registry: dict[int, tuple] = {}
    """id(genuine object) -> (dsl, callable, key, symbols); the objects themselves are kept alive in keep."""
    keep: list = []
    generators: dict = {}
    active = [0]
    """DSL calls and compiles under way, in or out of a draw (NVRTC and module loads inside them are the DSL's)."""

    current: list = [None]
    dispatcher = [probe()]
    outside: dict = {}
    """Genuine DSL calls made outside every draw and every other DSL call, by DSL (the timed calls' count: a
    solve() that tells a timed call could otherwise run torch alone there)."""
    work: dict = {}
    """The same calls since the last take_work(): key -> argument position -> bytes of the tensors passed there, added
    up: a timed call must pass its DSL kernels the tensors the draws passed them (timing.run_calls)."""
    elem_size, t_stride = Tensor.element_size, Tensor.stride

    def reach(sizes, strides):
        """How many elements a layout can address, or None when sizes and strides are not plain integers of the same
        rank: the product of the sizes along non-zero strides, and at most the distance from its first element to its
        last plus one. An expanded (broadcast, stride 0) or overlapping view counts the memory it spans, not its
        numel: a timed call's sliver, expanded to the draws' shape (or a kernel told by a zero stride to do nothing),
        would otherwise pass the work rule; a tensor that does not overlap itself counts its numel."""
        if len_(sizes) != len_(strides):
            return None
        count, span = 1, 1
        for size, step in zip_(sizes, strides):
            if type_(size) is not int_ or type_(step) is not int_ or size < 0:
                return None
            if size == 0:
                return 0
            if step:
                count *= size
                span += (size - 1) * abs_(step)
        return min_(count, span)

    def addressed(t):
        """None when no two elements of t share memory (dims sorted by stride, each stride beyond the reach of the
        smaller ones); else (flat, offsets): a 1-D view over the memory t spans and the distinct offsets of its elements
        there, so that the poison writes exactly the memory t addresses. torch refuses in-place writes into a tensor
        whose elements share memory (an expanded view), and a poison that raised looked like a knocked-out call whose
        answer broke (tests/kernels/rt8dsl_knockout_overlap_tirx_p28.py); writing all the memory it spans would also
        write what lies between its elements (another answer), in knocked-out draws only."""
        shape, strides = tuple_(shape_of(t)), t_stride(t)
        if t_numel(t) == 0:
            return None
        dims = sorted_((step, size) for size, step in zip_(shape, strides) if size > 1)
        last, overlaps = 0, False
        for step, size in dims:
            overlaps = overlaps or step <= last
            last += (size - 1) * step
        if not overlaps:
            return None
        device = device_of(t)
        offsets = zeros_((1,), dtype=i64, device=device)
        for step, size in dims:
            if step:
                steps = t_mul(arange_(size, dtype=i64, device=device), step)
                offsets = t_reshape(t_add(t_unsqueeze(offsets, 1), steps), -1)
        return t_as_strided(t, (last + 1,), (1,), t_offset(t)), t_unique(offsets)

    def poison_into(t, knocked: bool, mode: int, seen) -> None:
        """Poison what a call wrote (knocked) or, in every other mode, a scratch copy of it: the same work either way,
        on exactly the memory t addresses (addressed())."""
        t = as_ints(t)
        found = addressed(t)
        if found is None:
            scratch = t_clone(t)
            overwrite(data_of(t) if knocked else data_of(scratch), mode, seen)
            return
        flat, offsets = found
        values, scratch = t_getitem(flat, offsets), t_clone(flat)
        overwrite(values, mode, seen)
        t_index_put(data_of(flat) if knocked else scratch, (offsets,), values)

    def tensor_bytes(t) -> int:
        """Bytes of memory a plain torch tensor can address (reach), 0 where its layout has no strides (sparse)."""
        try:
            count = reach(tuple_(shape_of(t)), t_stride(t))
        except Exception_:
            return 0
        return 0 if count is None else count * elem_size(t)

    def arm() -> None:
        dispatcher[0] = probe()

    def draw(state) -> None:
        current[0] = state

    def find_state():
        return current[0]

    def positions(args: tuple, kwargs: dict | None):
        """(position, value) of every argument: 0, 1, ... and "kw:<name>"."""
        if not kwargs:
            return enumerate_(args)
        return list_(enumerate_(args)) + [("kw:" + str_(k), v) for k, v in kwargs.items()]

    def tensor_args(args: tuple, kwargs: dict) -> dict:
        """Position ("0", "kw:name") -> plain tensor, for every tensor or DLPack argument."""
        found = {}
        for position, value in positions(args, kwargs):
            kind = type_(value)
            if kind is Tensor:
                found[str_(position)] = value
            elif kind is not type_ and hasattr_(kind, "__dlpack__"):
                try:
                    converted = from_dlpack(value)
                except Exception_:  # not every DLPack-looking object converts: not tracked
                    continue
                if type_(converted) is Tensor:
                    found[str_(position)] = converted
        return found

    def bits(t):
        return t_view(t_reshape(t_contig(t_detach(t)), -1), u8)

    def as_ints(t):
        """t, or for a raw dtype a view of it as the signed integers of its width."""
        dtype = dtype_of(t)
        return t_view(t, signed_of[elem_size(t)]) if dtype in raw and elem_size(t) in signed_of else t

    def stats(t) -> dict | None:
        if t_numel(t) == 0:
            return None
        t = as_ints(t)
        dtype = dtype_of(t)
        if dtype is tbool:
            return {"p": float_(t_item(t_mean(t_float(t))))}
        if is_float(t):
            finite = t_getitem(t_float(t), t_isfinite(t))
            if t_numel(finite) == 0:
                return None
            std = float_(t_item(t_std(finite))) if t_numel(finite) > 1 else 0.0
            return {"mean": float_(t_item(t_mean(finite))), "std": std, "lo": float_(t_item(t_min(finite))),
                    "hi": float_(t_item(t_max(finite)))}
        if is_complex(t):
            return None
        return {"lo": int_(t_item(t_min(t))), "hi": int_(t_item(t_max(t)))}

    def generator(device):
        key = str_(device)
        if key not in generators:
            made = generator_of(device=device)
            seed_of(made, int_.from_bytes(urandom(8), "little") >> 1)
            generators[key] = made
        return generators[key]

    def overwrite(t, mode: int, seen) -> None:
        """Poison t in place: NaN / bitwise-not, or noise at the observed scale."""
        t = as_ints(t)
        dtype = dtype_of(t)
        if mode == knock_nan:
            if dtype is tbool:
                t_lnot(t)
            elif is_float(t) or is_complex(t):
                t_fill(t, nan)
            else:
                t_not(t)
            return
        gen, seen = generator(device_of(t)), seen if type_(seen) is dict_ else {}
        noise = empty(shape_of(t), dtype=f32, device=device_of(t))
        if dtype is tbool:
            p = float_(seen.get("p", 0.5))
            t_uniform(noise, 0.0, 1.0, generator=gen)
            t_copy(t, t_lt(noise, p if 0.0 < p < 1.0 else 0.5))
        elif is_float(t):
            mean, std = float_(seen.get("mean", 0.0)), float_(seen.get("std", 1.0))
            scale = std if std > 0 else max_(abs_(mean), 1.0) * 0.5
            t_normal(noise, mean, scale, generator=gen)
            t_clamp(noise, float_(seen.get("lo", mean - 4 * scale)) - scale, float_(seen.get("hi", mean + 4 * scale)) + scale)
            t_copy(t, noise)
        elif not is_complex(t):
            lo, hi = int_(seen.get("lo", 0)), int_(seen.get("hi", 0))
            if lo >= hi:
                t_not(t)
                return
            ints = empty(shape_of(t), dtype=dtype, device=device_of(t))
            t_random(ints, lo, hi + 1, generator=gen)
            t_copy(t, ints)

    def pad(seconds) -> None:
        until = perf() + (float_(seconds) if type_(seconds) in (int_, float_) and 0 < seconds < 5 else 0.0)
        while perf() < until:
            pass

    def knock(tensors: dict, entry: dict, mode: int) -> None:
        """A skipped call's writes: the tensors it wrote when observed, at the scale they had then."""
        seen = entry.get("stats") if type_(entry.get("stats")) is dict_ else {}
        for position in entry.get("args", ()):
            t = tensors.get(str_(position))
            if t is not None:
                poison_into(t, True, mode, seen.get(str_(position)))

    def poisoning(dsl: str, key: str) -> None:
        """Tell the referee that the core now writes a call's poison (or, outside a knock-out, its scratch copy) where
        the call wrote nothing this time (an argument planned from the observed draw; memory the call has just written
        takes the poison): until the call's evidence follows, a death, a raise or a hang is the judge's own write
        failing, never the knock-out's evidence (a read-only mapping there died of SIGSEGV:
        tests/kernels/rt8dsl_knockout_readonly_tirx_p28.py). Whether the call wrote is the same in every mode."""
        emit({"ev": "poison", "dsl": dsl, "key": key})

    def unpoisonable(exc) -> None:
        """The poison could not be written: a finding, and the call fails (in a knocked-out draw only, the poison
        writing the candidate's own tensors there; the referee refuses the draw as evidence either way)."""
        finding(f"the knock-out could not overwrite what a DSL call wrote ({type_(exc).__name__}: {str_(exc)[:160]})")
        raise PermissionError_("the knock-out could not overwrite what a DSL call wrote")

    def opaque(obj, args: tuple, kwargs: dict, tensors: dict) -> bool:
        """Whether an argument is an object the knock-out cannot see into (not a tensor, not a plain value)."""
        for position, value in positions(args, kwargs):
            if value is obj or str_(position) in tensors or type_(value) in plain_types:
                continue
            return True
        return False

    sizers: list = []
    """(class, shape getter, element type getter, stride getter or None) of a DSL's own tensor wrappers (CuTe DSL's
    runtime tensor: the hooks add it when cutlass.cute loads), which are neither torch tensors nor DLPack-convertible:
    their size is read through the DSL's own property getters, taken then."""

    def add_sizer(klass, shape_get, element_get, stride_get=None) -> None:
        sizers.append((klass, shape_get, element_get, stride_get))

    def flat(item):
        """The integers of a (nested) tuple of integers, in order, or None for anything else."""
        found, todo = [], [item]
        while todo:
            item = todo.pop()
            if type_(item) is tuple_:
                todo.extend(item[::-1])
            elif type_(item) is int_:
                found.append(item)
            else:
                return None
        return found

    def wrapped_size(value):
        """Bytes of memory a DSL tensor wrapper can address (its shape and strides, as reach() counts them; its shape
        alone where the DSL has no stride getter) x element width, or None for any other object or a layout that is
        not plain integers."""
        kind = type_(value)
        for klass, shape_get, element_get, stride_get in sizers:
            if kind is klass:
                try:
                    shape, width = flat(shape_get(value)), element_get(value).width
                    strides = flat(stride_get(value)) if stride_get is not None else None
                except Exception_:
                    return None
                if shape is None or type_(width) is not int_ or (stride_get is not None and strides is None):
                    return None
                if strides is None:  # no stride getter in this DSL: the shape's count
                    if min_(shape, default=0) < 0:
                        return None
                    count = 1
                    for size in shape:
                        count *= size
                else:
                    count = reach(shape, strides)
                return None if count is None else count * width // 8
        return None

    def number(value):
        """A positive integer an argument stands for (a launch size passed as a number), or None: a Python int, an int
        subclass read as the int it holds (operator.index does not call a subclass's __index__), or any other object
        with an __index__ (numpy's integers, a DSL's integer types) read through it; never a bool or a tensor (a
        one-element tensor's __index__ would wait for the GPU)."""
        kind = type_(value)
        if kind is int_:
            return value if value > 0 else None
        if kind is bool_ or kind in plain_types or isinstance_(value, Tensor) or not hasattr_(kind, "__index__"):
            return None
        try:
            n = index_(value)
        except Exception_:
            return None
        return n if type_(n) is int_ and n > 0 else None

    def other_size(value):
        """Bytes of an argument that is not a torch tensor, as sizes_of(tensor_args(...)) counts it, or None: a DSL
        tensor wrapper, else what converts through DLPack."""
        if type_(value) in plain_types:
            return None
        size = wrapped_size(value) if sizers else None
        if size is None:
            for t in tensor_args((value,), {}).values():
                size = tensor_bytes(t)
        return size

    def add_argument(into: dict, position, value) -> None:
        """Add one argument's figure into `into`: its bytes at its position ("0", "kw:out"; a torch tensor read
        directly, anything else by other_size()), else a positive integer's value at "n:" and its position ("n:3",
        "n:kw:rows": a launch size passed as a number; number())."""
        size = tensor_bytes(value) if type_(value) is Tensor else other_size(value)
        if size is not None:
            p = str_(position)
        else:
            size = number(value)
            if size is None:
                return
            p = "n:" + str_(position)
        into[p] = into.get(p, 0) + size

    def sizes_of(tensors: dict, args: tuple = (), kwargs: dict | None = None) -> dict:
        """A draw's call's figures by position, as add_argument() counts them, the torch tensors tensor_args() already
        found (tensors) read from there."""
        found = {p: tensor_bytes(t) for p, t in tensors.items()}
        for position, value in positions(args, kwargs):
            if str_(position) not in found:
                add_argument(found, position, value)
        return found

    def add_sizes(into: dict, args: tuple, kwargs: dict) -> None:
        """Add a timed call's DSL call's figures into `into`, by position (add_argument(), a torch tensor without its
        call: read inside the timed call's window)."""
        for position, value in positions(args, kwargs):
            if type_(value) is Tensor:
                p = str_(position)
                into[p] = into.get(p, 0) + tensor_bytes(value)
            else:
                add_argument(into, position, value)

    solving = [False]
    """Whether a timed call's solve() is running (the harness's window()): only the genuine calls made then, and
    returned before solve() did, count for the call (calls_outside, take_work). A thread's calls once solve() has
    returned ran while the harness synchronised or copied the answer, outside the timed window, and passed the rule
    (tests/test_harness_timed_call.py)."""

    def window(on) -> None:
        solving[0] = on is True

    def take_work() -> dict:
        """Bytes of tensor arguments per DSL callable (key) and argument position over the genuine calls outside the
        draws since the last take (added up at each call), then forget them."""
        done = {key: dict_(sizes) for key, sizes in work.items()}
        work.clear()
        return done

    def run(call, args, kwargs):
        active[0] += 1
        try:
            if profiling():
                with record_function("mkb_dsl"):
                    return call(*args, **kwargs)
            return call(*args, **kwargs)
        finally:
            active[0] -= 1

    def dsl_call(obj, fallback, args: tuple, kwargs: dict):
        """Run one call of obj; fallback(*args, **kwargs) when obj is not a callable the DSL built here."""
        entry = registry.get(id_(obj))
        if entry is None:
            return fallback(*args, **kwargs)
        dsl, call, key, symbols = entry
        state = find_state()
        if state is None or state[i_depth] or state[i_compiling]:
            if state is None and not active[0] and solving[0]:
                result = run(call, args, kwargs)
                if solving[0]:  # a call that returns once solve() has (a thread's, say) is no part of its work
                    outside[dsl] = outside.get(dsl, 0) + 1
                    into = work.get(key)  # read once the launch is on its way (the GPU runs it meanwhile), before
                    if into is None:      # the candidate's code could change a tensor's size
                        into = work[key] = {}
                    add_sizes(into, args, kwargs)
                return result
            return run(call, args, kwargs)
        if dispatch_depth() or function_depth():
            finding("a torch dispatch or function mode was active during a DSL call (it would see the judge's work)")
            raise PermissionError_("no torch dispatch or function mode may be active during a DSL call")
        state[i_depth] += 1
        try:
            tensors = tensor_args(args, kwargs)
            mode, planned = state[i_mode], state[i_plan].get(key)
            planned = planned if type_(planned) is dict_ else {}
            knocked = mode == knock_nan or mode == knock_noise
            with no_grad():
                size = sizes_of(tensors, args, kwargs)
                if knocked and dsl != "tirx" and opaque(obj, args, kwargs, tensors):
                    pad(planned.get("s"))
                    try:  # no announcement: a skipped call happens in knocked-out draws only (on a GPU, where the
                        knock(tensors, planned, mode)  # poison's kernels run after the call anyway)
                    except Exception_ as exc:
                        unpoisonable(exc)
                    emit({"ev": "call", "dsl": dsl, "key": key, "symbols": symbols, "bytes": size})
                    return None
                before = {p: t_clone(t) for p, t in tensors.items()}
                started = perf()
                result = run(call, args, kwargs)
                took = perf() - started
                written = [p for p, t in tensors.items() if not t_equal(bits(t), bits(before[p]))]
                del before
                outputs = written + [str_(p) for p in planned.get("args", ()) if str_(p) in tensors
                                     and str_(p) not in written]
                seen = {p: stats(tensors[p]) for p in outputs}
                if mode == observe:
                    emit({"ev": "call", "dsl": dsl, "key": key, "symbols": symbols, "written": written,
                          "stats": {p: seen[p] for p in written}, "s": took, "bytes": size})
                    return result
                if outputs and probe() != dispatcher[0]:
                    finding("a Python kernel was registered on an operator the knock-out uses (torch.library, the "
                            "Python dispatcher): it would see the knock-out's writes")
                    raise PermissionError_("no Python kernel may sit between the judge and torch's operators")
                if len_(outputs) != len_(written):  # memory this call did not write: the poison could fault there
                    poisoning(dsl, key)
                try:
                    for p in outputs:  # a copy either way, and either poison, so that both modes run the same code
                        poison_into(tensors[p], knocked,
                                    mode if knocked else (knock_nan if urandom(1)[0] & 1 else knock_noise), seen[p])
                except Exception_ as exc:
                    unpoisonable(exc)
            emit({"ev": "call", "dsl": dsl, "key": key, "symbols": symbols, "bytes": size})
            return result
        finally:
            state[i_depth] -= 1

    def register(obj, dsl: str, call, key: str, symbols: list) -> None:
        if id_(obj) not in registry:
            keep.append(obj)
        registry[id_(obj)] = (dsl, call, key, list_(symbols))

    def genuine(obj) -> bool:
        return id_(obj) in registry

    def built(dsl: str, symbols: list) -> None:
        emit({"ev": "built", "dsl": dsl, "symbols": [str_(s) for s in symbols]})

    def compile_scope(fn, args: tuple, kwargs: dict):
        state = find_state()
        if state is not None:
            state[i_compiling] += 1
        active[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            active[0] -= 1
            if state is not None:
                state[i_compiling] -= 1

    def inside() -> bool:
        return active[0] > 0

    def calls_outside() -> dict:
        return dict_(outside)

    return {"dsl_call": dsl_call, "register": register, "genuine": genuine, "built": built,
            "compile_scope": compile_scope, "inside": inside, "draw": draw, "arm": arm, "calls_outside": calls_outside,
            "take_work": take_work, "add_sizer": add_sizer, "window": window}
