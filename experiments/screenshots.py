"""The README's MLflow screenshots, made from a store's runs in the real MLflow UI:

    python -m experiments.screenshots --run RUN_ID --sweep SWEEP_DIR [--tracking-uri URI] [--out docs]

serves the store with `mlflow ui` on a free loopback port, opens the pages in headless Chromium
(experiments/bench/chromium.py) at the links the project prints (`opd.tracking.ui`: the UI's
machine-learning view), closes the UI's assistant panel and banners, and writes
- `mlflow-run.png`: the run page of `RUN_ID`;
- `mlflow-sweep-runs.png`: the runs table of the sweep in SWEEP_DIR, in its saved view (its jobs,
  the swept keys and the objective as columns);
- `mlflow-sweep-chart.png`: the same view's charts (each job's metrics per step).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from opd.cli import fail
from opd.config import ConfigError
from opd.tracking.ui import run_link, view_link

logger = logging.getLogger("experiments.screenshots")

ROOT = Path(__file__).resolve().parents[1]
# The size of the pages (the README shows them at this width).
WIDTH, HEIGHT = 1500, 900
# Closes the UI's assistant panel and its banners, where shown (their buttons' labels).
_TIDY = """(() => {
  const labels = ['Close', 'Hide banner'];
  for (const button of document.querySelectorAll('button')) {
    if (labels.includes(button.getAttribute('aria-label'))) button.click();
  }
  return true;
})()"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def mlflow_ui(tracking_uri: str, startup_s: float = 240.0) -> Iterator[str]:
    """`mlflow ui --backend-store-uri URI` on a free loopback port until the block ends; its address."""
    port = _free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri, "--host", "127.0.0.1", "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + startup_s
            while True:
                try:
                    with urllib.request.urlopen(base + "/health", timeout=2):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise RuntimeError(f"mlflow ui did not answer in {startup_s:.0f} s: {log.read().decode(errors='replace')[-2000:]}") from None
                    time.sleep(0.3)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def show(browser: object, url: str, ready: str, settle_s: float = 3.0, timeout_s: float = 120.0) -> str:
    """Open `url`, wait until the page's text holds `ready`, tidy it (assistant panel, banners)
    and let it settle; the page's text."""
    import json

    browser.goto(url)  # type: ignore[attr-defined]
    browser.wait_for(f"document.body.innerText.includes({json.dumps(ready)})", timeout_s)  # type: ignore[attr-defined]
    browser.evaluate(_TIDY)  # type: ignore[attr-defined]
    time.sleep(settle_s)
    return str(browser.evaluate("document.body.innerText"))  # type: ignore[attr-defined]


def screenshots(tracking_uri: str, run_id: str, sweep_dir: Path, out: Path) -> list[Path]:
    """Write the three screenshots (see the module docstring) into `out`; their paths."""
    import mlflow

    from experiments.bench.chromium import Chromium
    from opd.sweep.state import read_state

    client = mlflow.MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    state = read_state(sweep_dir)
    if state is None or not state.parent_run_id or not state.experiment_id:
        raise ConfigError(f"--sweep={str(sweep_dir)!r}: not a tracked sweep directory (no opd_sweep.json with a parent run)", "--sweep")
    swept = state.swept[0] if state.swept else "objective"
    written = []
    with mlflow_ui(tracking_uri) as base, Chromium(WIDTH, HEIGHT, timeout_s=120) as browser:
        show(browser, run_link(base, run.info.experiment_id, run_id), "About this run")
        written.append(browser.screenshot(out / "mlflow-run.png"))
        view = view_link(base, state.experiment_id, state.parent_run_id)
        show(browser, view, swept.rsplit(".", 1)[-1])
        written.append(browser.screenshot(out / "mlflow-sweep-runs.png"))
        show(browser, view + "&compareRunsMode=CHART", "objective", settle_s=6.0)
        written.append(browser.screenshot(out / "mlflow-sweep-chart.png"))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.screenshots", description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, help="the run whose page is shown (its id)")
    parser.add_argument("--sweep", type=Path, required=True, help="the sweep directory whose jobs are shown")
    parser.add_argument("--tracking-uri", default="sqlite:///outputs/mlflow.db", help="the store of both")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="where the PNG files go")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from opd.tracking.store import absolute_tracking_uri

    if not args.out.is_dir():
        fail(f"--out={str(args.out)!r}: no such directory")
    try:
        for path in screenshots(absolute_tracking_uri(args.tracking_uri), args.run, args.sweep, args.out):
            logger.info("wrote %s", path)
    except ConfigError as err:
        fail(str(err))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
