"""Device probe of session 14: host time per launch of the three edge walks (direct vs Triton's path) and per op
call, GPU kept busy by a queued sleep (host time only), alternating rounds in one process. Imports its neighbour
launcher_toggle.py (run from this folder, with the repository on PYTHONPATH)."""
import statistics
import time

import torch
from launcher_toggle import LAUNCHERS, setup

from gtnorm.triton.launcher import Launcher


def host_us(fn, leaves=(), reps=20, trials=3):
    for _ in range(3):
        fn()
    times = []
    for _ in range(trials):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(2e8))
        t = time.perf_counter()
        for _ in range(reps):
            for leaf in leaves:
                leaf.grad = None
            fn()
        times.append((time.perf_counter() - t) / reps * 1e6)
    torch.cuda.synchronize()
    return min(times)


def main():
    for spec in ["h_to_h_tiny:16", "h_to_era_small:4"]:
        name, heads = spec.split(":")
        rows = setup(name, int(heads))
        recorded = []
        original = Launcher.launch

        def record(self, grid, args, kwargs, recorded=recorded, original=original):
            recorded.append((self, grid, args, kwargs))
            return original(self, grid, args, kwargs)

        Launcher.launch = record
        fn, leaves = rows["op_fb"]
        fn()
        Launcher.launch = original
        for launcher, grid, args, kwargs in recorded:
            rows[f"launch {launcher.kernel.fn.__name__[:28]}"] = (
                lambda launcher=launcher, grid=grid, args=args, kwargs=kwargs: launcher.launch(grid, args, kwargs), ())
        got = {}
        for _ in range(7):
            for mode in ("triton", "direct"):
                for launcher in LAUNCHERS:
                    launcher._direct = mode == "direct"
                for row, (fn, leaves) in rows.items():
                    if row.startswith("anemoi"):
                        continue
                    got.setdefault((row, mode), []).append(host_us(fn, leaves))
        for (row, mode), vals in sorted(got.items()):
            print(f"{name:15s} H{heads:<3s} {row:38s} {mode:7s} host median {statistics.median(vals):7.1f} us  "
                  f"rounds {' '.join(f'{v:.0f}' for v in vals)}", flush=True)


if __name__ == "__main__":
    main()
