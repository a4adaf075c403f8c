"""Starting the ranks: one process per rank, a real `torch.distributed` group between them.

Introduced in notebook 10 (past one device).

`run_ranks(world, fn)` starts `world` processes (spawned, so that a notebook,
the CLI and the tests start them alike), each with `threads` CPU threads. They meet at
127.0.0.1 on a free port: gloo on a CPU, NCCL with one GPU per rank on CUDA. Each calls
`fn(rank, world, *args)`; the results come back in rank order. `run_tensor_parallel(model,
world, fn)` runs on it: each rank builds its share of `model` (`tensor.shard_model`; the model's
tensors reach the processes through shared memory, not a copy per rank) and calls
`fn(rank_model, rank, world, *args)`.

Nothing here may hang. A rank that raises sends its error back, and the parent raises it as one
sentence. A rank that dies without a word is seen by its exit code. Either way every other rank
is stopped. The collectives themselves time out after `timeout` seconds.
"""

from __future__ import annotations

import os
import pickle
import queue as queues
import socket
import sys
import time
from datetime import timedelta

import torch

from ...errors import LabError, first_line
from ...inputs import finite_number
from ..hardware import pick_device
from ..models.transformer import Transformer
from .tensor import Collectives, plan_split, require_float_model, shard_model

MAX_TIMEOUT_S = 30 * 24 * 3600.0          # a month: no run needs more (far more overflows the collectives' timer)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now. Notebook 10 (past one device)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise LabError(f"The port must be a whole number from 1024 to 65535, got {port!r}.")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            raise LabError(f"Port {port} on 127.0.0.1 is in use: pick another one, or leave port=None "
                           "for a free one.") from None


def _check_room(world: int, threads: int, device: torch.device) -> None:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise LabError(f"threads (CPU threads per rank) must be a whole number, 1 or more; got {threads!r}.")
    if device.type == "cuda":
        if world > torch.cuda.device_count():
            raise LabError(f"{world} ranks need {world} GPUs, one each; this machine has "
                           f"{torch.cuda.device_count()}. Use fewer ranks.")
        return
    cores = os.cpu_count() or 1
    if world * threads > cores:
        raise LabError(f"{world} ranks of {threads} thread(s) need {world * threads} cores; this machine has "
                       f"{cores}. Use fewer ranks or threads: ranks sharing a core only take turns.")


def run_tensor_parallel(model, world: int, fn, args: tuple = (), threads: int = 1, port: int | None = None,
                        timeout: float = 300.0) -> list:
    """`fn(rank_model, rank, world, *args)` on `world` ranks of `model`, each in its own process;
    returns each rank's result, in rank order.

    Notebook 10 (past one device). fn must be importable by name (a module's function, not a
    lambda), and its result picklable. Refuses, in one sentence: a degree the model cannot be
    split into (`plan_split`), more ranks x threads than cores (more ranks than GPUs), a port in
    use. timeout: seconds for the whole run and for each collective.
    """
    require_float_model(model)                              # a Transformer of float weights, or one sentence
    plan_split(model.config, world)                         # refuses a degree the heads cannot take
    return run_ranks(world, _sharded, (model_payload(model), fn, args), threads=threads, port=port,
                     timeout=timeout, device=model.device)


def model_payload(model) -> tuple:
    """What the ranks get of `model`. On the CPU the model itself: its tensors reach the ranks
    through shared memory, not copied. On a GPU its config, dtype and weights on the host: CUDA
    tensors would reach every rank as GPU 0's, opening a context there from each rank before it
    picks its own GPU. Notebook 10 (past one device)."""
    if model.device.type != "cuda":
        return ("model", model)
    weights = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    return ("weights", model.config, model.dtype, weights)


def rank_share(rank: int, world: int, payload: tuple):
    """This rank's share of the payload's model, built on its own GPU on CUDA (after `_rank_main`
    picked it); the whole model it was cut from is dropped, so only the share stays in GPU memory
    (with the embedding and norms it shares). Notebook 10 (past one device)."""
    if payload[0] == "model":
        return shard_model(payload[1], rank, world, Collectives())
    _, config, dtype, weights = payload
    whole = Transformer.from_state_dict(config, weights, device=f"cuda:{rank}", dtype=dtype)
    share = shard_model(whole, rank, world, Collectives())
    del whole
    torch.cuda.empty_cache()
    return share


def _sharded(rank, world, payload, fn, args):
    """One rank of `run_tensor_parallel`: its share of the model (`rank_share`), then fn."""
    return fn(rank_share(rank, world, payload), rank, world, *args)


def run_ranks(world: int, fn, args: tuple = (), threads: int = 1, port: int | None = None,
              timeout: float = 300.0, device="cpu") -> list:
    """`fn(rank, world, *args)` in `world` processes joined in one `torch.distributed` group at
    127.0.0.1 (gloo; NCCL with one GPU per rank when `device` is CUDA); returns each rank's
    result, in rank order. Notebook 10 (past one device): `run_tensor_parallel` and the
    checkers run their ranks through it. The same refusals and timeout as `run_tensor_parallel`;
    also, in one sentence and before any rank starts, a function or arguments that cannot be
    pickled (a lambda, a function defined inside another, a lock or a generator)."""
    device, args, timeout = require_launch(world, fn, args, threads, timeout, device)
    _check_main_importable()
    if port is None:
        port = free_port()
    else:
        _check_port(port)
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=_rank_main, daemon=True,
                             args=(rank, world, port, threads, timeout, device.type, fn, args, results))
             for rank in range(world)]
    started = []
    try:
        for process in ranks:
            _start(process)
            started.append(process)
        return _collect(ranks, results, timeout)
    finally:
        for process in started:
            if process.is_alive():
                process.terminate()
            process.join(timeout=10)


def require_launch(world, fn, args, threads, timeout, device) -> tuple[torch.device, tuple, float]:
    """The checks `run_ranks` makes before it starts a process: (device, args, timeout), or one
    sentence. Notebook 10 (past one device); pure, so a test can try any value on it."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise LabError(f"The number of ranks must be a whole number, 1 or more; got {world!r}.")
    if not callable(fn):
        raise LabError(f"fn must be a function the ranks call as fn(rank, world, *args), got {type(fn).__name__}.")
    if not isinstance(args, (tuple, list)):
        raise LabError(f"args must be a tuple of fn's further arguments (e.g. (prompt,)), got {type(args).__name__}.")
    timeout = finite_number(timeout, "timeout (seconds for the run and each collective)", minimum=0,
                            maximum=MAX_TIMEOUT_S, above_minimum=True)
    device = pick_device(device)
    if device.type not in ("cpu", "cuda"):
        raise LabError(f"The ranks meet through gloo on a CPU or NCCL on CUDA GPUs, not on {device.type}; "
                       "use device='cpu'.")
    _check_room(world, threads, device)
    return device, tuple(args), timeout


def _start(process) -> None:
    """Start one rank; spawning pickles its function and arguments here, in this process."""
    try:
        process.start()
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise LabError(f"The ranks' function and arguments must be picklable to reach the new processes "
                       f"({first_line(error, with_type=True)}): define fn with def at the top of a module or "
                       "a notebook cell (not a lambda, nor inside another function), and pass no lock, open "
                       "file or generator.") from None


def _check_main_importable() -> None:
    """Spawned ranks start by running the file that started this process again; Python reading
    from standard input (`python - <<EOF`) has no such file, and every rank would die at once."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path is not None and not os.path.isfile(path):
        raise LabError(f"The ranks are new processes that first run the file that started this one, and "
                       f"{path!r} is not a file (Python read its code from standard input); save the code "
                       f"in a .py file and run that, or run it in a notebook.")


def _collect(ranks, results, timeout: float) -> list:
    """Each rank's result, or one sentence for the first rank that failed or died."""
    out: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    while len(out) < len(ranks):
        try:
            status, rank, value = results.get(timeout=0.2)
        except queues.Empty:
            _raise_if_one_died(ranks, out)
            if time.monotonic() > deadline:
                raise LabError(f"The {len(ranks)} ranks did not finish within {timeout:.0f} s; they were "
                               "stopped. Give a longer timeout, or less work.") from None
            continue
        if status == "error":
            # A rank whose peer died fails in its next collective ("connection closed by peer"):
            # the death is the cause to report, so give it a moment to show.
            for _ in range(10):
                _raise_if_one_died(ranks, out)
                time.sleep(0.1)
            raise LabError(f"Rank {rank} of {len(ranks)} failed: {value} The other ranks were stopped.")
        out[rank] = pickle.loads(value)
    return [out[rank] for rank in range(len(ranks))]


def _raise_if_one_died(ranks, finished) -> None:
    dead = [(r, p.exitcode) for r, p in enumerate(ranks) if p.exitcode not in (None, 0) and r not in finished]
    if dead:
        rank, code = dead[0]
        raise LabError(f"Rank {rank} of {len(ranks)} died (exit code {code}) before it finished; "
                       "the other ranks were stopped.") from None


def _rank_main(rank, world, port, threads, timeout, device_type, fn, args, results) -> None:
    """One rank's process: join the group, run fn, send the result back (or one sentence)."""
    try:
        torch.set_num_threads(threads)
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(rank)
        torch.distributed.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                             world_size=world, timeout=timedelta(seconds=timeout))
        try:
            # by value (plain pickle): a tensor sent through shared memory would vanish with this process
            results.put(("ok", rank, pickle.dumps(fn(rank, world, *args))))
        finally:
            torch.distributed.destroy_process_group()
    except BaseException as error:             # noqa: BLE001 - sent back as one sentence, never a traceback here
        results.put(("error", rank, _one_line(error)))


def _one_line(error: BaseException) -> str:
    """A rank's error as one line ending in a period: its message's first line (where Python,
    torch and gloo put what went wrong; the lines after it are where, or advice), or its type."""
    message = first_line(error, limit=300)
    return message if message.endswith(".") else message + "."
