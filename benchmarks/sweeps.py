"""A hyperparameter sweep with ASHA early stopping against the full grid, in the same run.

    python benchmarks/sweeps.py [--epochs 30] [--eta 2] [--parallel 2] [--seed 0]

One control plane (local executor, `--parallel` slots) and the demo's tiny model and data. The
search space is 8 learning rates (1e-4 to 3e-1), taken in the order the sweep's seed shuffles
them; both sweeps run every trial with the same training seed and body, so a trial with the same
learning rate trains the same way in both. The first sweep
judges trials with ASHA on the validation loss at epoch checkpoints (rungs at 1, eta, eta^2, ...
epochs); the second runs the whole grid to the end. Printed: each trial's status and objective,
the trials stopped early, the GPU-seconds each sweep spent (attempts' GPU time as metered), and
whether ASHA's best trial is the grid's best (same learning rate, same validation loss).
Exits 1 when ASHA stopped fewer than half the trials, spent no less GPU time, or missed the best.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx

RATES = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0, help="the sweeps' seed (the grid's order)")
    parser.add_argument("--eta", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    args = parser.parse_args()

    from tuneforge.demo.dataset import DEMO_LORA, write_demo_files
    from tuneforge.demo.tiny_model import build_tiny_model
    from tuneforge.server import ControlPlane
    from tuneforge.services.serving import base_models as base_model_service
    from tuneforge.services.tenancy import tenants as tenant_service
    from tuneforge.settings import Settings

    root = Path(tempfile.mkdtemp(prefix="tuneforge-sweeps-"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = Settings(home=root / "home", port=port, local_gpus=args.parallel, eval_by_default=False,
                        scheduler_tick_s=0.2)
    model_dir = build_tiny_model(root / "model")
    files = write_demo_files(root / "data")
    with ControlPlane(settings) as plane:
        with plane.platform.db.session() as session:
            _tenant, key = tenant_service.create_tenant(session, "bench")
            base_model_service.add_base_model(session, plane.platform.store, "tiny-chat", str(model_dir),
                                              root / "hub")
        api = httpx.Client(base_url=plane.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        training = _upload(api, files.training_path)
        validation = _upload(api, files.validation_path)
        job = {"model": "tiny-chat", "training_file": training, "validation_file": validation, "seed": 3,
               "method": {"type": "supervised", "supervised": {"hyperparameters": {
                   "n_epochs": args.epochs, "batch_size": 8}}},
               "training_type": {"type": "lora", **DEMO_LORA}}
        space = {"learning_rate": {"type": "choice", "values": RATES}}
        results = {}
        for name, stopping in (("asha", {"type": "asha", "min_epochs": 1, "eta": args.eta}), ("grid", None)):
            body = {"job": job, "search_space": space, "sampler": "grid", "max_parallel": args.parallel,
                    "seed": args.seed}
            if stopping:
                body["early_stopping"] = stopping
            created = api.post("/v1/fine_tuning/sweeps", json=body)
            created.raise_for_status()
            started = time.perf_counter()
            results[name] = _wait(api, created.json()["id"], args.timeout_s)
            results[name]["wall_s"] = time.perf_counter() - started
    results["epochs"] = args.epochs
    return _report(results)


def _upload(api: httpx.Client, path: Path) -> str:
    with path.open("rb") as handle:
        answer = api.post("/v1/files", files={"file": (path.name, handle)}, data={"purpose": "fine-tune"})
    answer.raise_for_status()
    from harness import wait_processed  # a sweep needs its files processed, not still processing

    return wait_processed(api, answer.json())["id"]


def _wait(api: httpx.Client, sweep_id: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sweep = api.get(f"/v1/fine_tuning/sweeps/{sweep_id}").json()
        if sweep["status"] != "running":
            return sweep
        time.sleep(1.0)
    raise SystemExit(f"sweep {sweep_id} still running after {timeout_s:.0f} s")


def _epochs_trained(sweep: dict, epochs: int) -> float:
    """Epochs the sweep's trials trained: all of them for a completed trial, up to the rung it was
    stopped at for the others."""
    stopping = sweep["early_stopping"] or {}
    rungs = [stopping.get("min_epochs", 1.0) * stopping.get("eta", 2) ** k for k in range(64)]
    return sum(epochs if t["status"] == "completed" else rungs[max(0, len(t["rungs"]) - 1)]
               for t in sweep["trials"])


def _report(results: dict) -> int:
    asha, grid = results["asha"], results["grid"]
    for name in ("asha", "grid"):
        sweep = results[name]
        print(f"\n{name}: {sweep['status']}, {len(sweep['trials'])} trials, {sweep['stopped_early']} stopped early, "
              f"{sweep['gpu_seconds']:.1f} GPU-seconds, {sweep['wall_s']:.0f} s wall")
        print(f"  {'lr':>8}  {'status':<10} {'rungs (validation loss)':<34} {'objective':>10} {'GPU-s':>8}")
        for trial in sweep["trials"]:
            rungs = ", ".join(f"{value:.4f}" for value in trial["rungs"])
            objective = "—" if trial["objective"] is None else f"{trial['objective']:.4f}"
            print(f"  {trial['params']['learning_rate']:>8g}  {trial['status']:<10} {rungs:<34} {objective:>10} "
                  f"{trial['gpu_seconds']:>8.1f}")
    epochs = {name: _epochs_trained(sweep, results["epochs"]) for name, sweep in (("asha", asha), ("grid", grid))}
    print(f"\nepochs trained: ASHA {epochs['asha']:g} against the full grid's {epochs['grid']:g} "
          f"({1 - epochs['asha'] / epochs['grid']:.0%} fewer); each trial also pays a fixed start "
          "(process, imports, model load) that early stopping cannot save")
    best_asha, best_grid = asha["best_trial"], grid["best_trial"]
    same_best = bool(best_asha and best_grid and best_asha["params"] == best_grid["params"]
                     and best_asha["objective"] == best_grid["objective"])
    saved = 1 - asha["gpu_seconds"] / grid["gpu_seconds"] if grid["gpu_seconds"] else 0.0
    print(f"\nASHA stopped {asha['stopped_early']} of {len(asha['trials'])} trials early; GPU time "
          f"{asha['gpu_seconds']:.1f} s against the full grid's {grid['gpu_seconds']:.1f} s ({saved:.0%} less)")
    print(f"best: ASHA lr={best_asha and best_asha['params']['learning_rate']} "
          f"loss={best_asha and best_asha['objective']}; grid lr={best_grid and best_grid['params']['learning_rate']} "
          f"loss={best_grid and best_grid['objective']}; the same: {same_best}")
    ok = asha["stopped_early"] * 2 >= len(asha["trials"]) and asha["gpu_seconds"] < grid["gpu_seconds"] and same_best
    print("sweeps:", "all checks passed" if ok else "a check failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
