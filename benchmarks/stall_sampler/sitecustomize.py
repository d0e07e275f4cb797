"""Where a stalled training step waits: a sampler loaded into every Horovod rank (diagnostic).

Put this directory first on ``PYTHONPATH`` and set ``HVD_FLEXCOMM_STALL_LOG_DIR``; every Python
process that Horovod starts (``HOROVOD_RANK`` set) then writes ``r<rank>_<pid>.log`` there:

- ``gc <unix s> gen=<g> ms=<ms>``: a garbage collection that took over 50 ms;
- ``starved <unix s> ms=<ms>``: the sampler thread woke up over 500 ms late (this process got no
  CPU, or the thread no GIL, for that long);
- ``held <unix s> ms=<ms>`` and a stack: the main thread's stack stayed the same for over 700 ms
  (sampled every 50 ms); the stack where it waited follows (a wait in a collective ends in
  Horovod's ``synchronize``, or in ``hvd_flexcomm/waiting.py``; a stall outside collectives ends
  anywhere else).

``benchmarks/bench_adaptive.py`` passes ``PYTHONPATH`` on to its jobs (``jobctl.job_env``). Used for
``docs/performance/stalls.md``. Loaded by Python's ``site`` module at start-up; does nothing
without both variables.
"""

import os

if "HOROVOD_RANK" in os.environ and os.environ.get("HVD_FLEXCOMM_STALL_LOG_DIR"):
    import gc
    import sys
    import threading
    import time
    import traceback

    _dir = os.environ["HVD_FLEXCOMM_STALL_LOG_DIR"]
    os.makedirs(_dir, exist_ok=True)
    _log = open(os.path.join(_dir, f"r{os.environ['HOROVOD_RANK']}_{os.getpid()}.log"), "a",
                buffering=1)
    _log.write(f"start {time.time():.3f} argv={sys.argv[:3]}\n")
    _gc_started = [0.0]

    def _on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            _gc_started[0] = time.perf_counter()
            return
        ms = 1e3 * (time.perf_counter() - _gc_started[0])
        if ms > 50:
            _log.write(f"gc {time.time():.3f} gen={info.get('generation')} ms={ms:.0f}\n")

    gc.callbacks.append(_on_gc)
    _main_id = threading.main_thread().ident

    def _sample() -> None:
        last = since = time.perf_counter()
        key, stack = None, []
        while True:
            time.sleep(0.05)
            now = time.perf_counter()
            if now - last > 0.5:
                _log.write(f"starved {time.time():.3f} ms={1e3 * (now - last - 0.05):.0f}\n")
            last = now
            frame = sys._current_frames().get(_main_id)
            if frame is None:
                return
            here = tuple((f.f_code.co_filename, lineno) for f, lineno in traceback.walk_stack(frame))
            if here != key:
                if key is not None and now - since > 0.7:
                    _log.write(f"held {time.time():.3f} ms={1e3 * (now - since):.0f}\n"
                               + "".join(stack))
                key, since, stack = here, now, traceback.format_stack(frame, limit=14)

    threading.Thread(target=_sample, name="hvd_flexcomm-stall-sampler", daemon=True).start()
