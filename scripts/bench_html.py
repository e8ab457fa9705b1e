"""Size and render time of the HTML report of a model with 500+ layers, in headless Chromium.

A 250-block residual MLP (x + GELU(Linear(x)): 500 leaf modules) is exported by the TorchScript exporter, one Linear's weight
is perturbed, and the bisection's report is written with ``--html``.  The page is then opened in headless Chromium
several times: the render time is from navigation start until the second animation frame after the load event
(the page parsed, laid out and painted), measured by a timing script added to a copy of the page; the wall time
of a whole ``chromium --screenshot`` run (browser start included) is printed beside it.

    python scripts/bench_html.py [--blocks 250] [--runs 5] [--out report.html] [--screenshot shot.png]
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plant  # noqa: E402

import onnx_bisect  # noqa: E402

TIMING = ("window.addEventListener('load',function(){requestAnimationFrame(function(){requestAnimationFrame("
          "function(){console.log('render-ms '+performance.now().toFixed(1)+' layers '+"
          "document.querySelectorAll('#layers tbody tr').length)})})});")


class Block(torch.nn.Module):
    """A residual block: ``x + GELU(Linear(x))``."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        torch.nn.init.normal_(self.fc.weight, std=0.05)  # small residual updates: the activations stay O(1)
        torch.nn.init.zeros_(self.fc.bias)
        self.act = torch.nn.GELU()

    def forward(self, x):
        return x + self.act(self.fc(x))


class Deep(torch.nn.Module):
    """``blocks`` residual blocks (two leaf modules each)."""

    def __init__(self, blocks: int):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[Block() for _ in range(blocks)])

    def forward(self, x):
        return self.blocks(x)


def report_of(blocks: int):
    """Bisect the deep MLP against its export with one weight perturbed (a third of the way in)."""
    torch.manual_seed(0)
    model = Deep(blocks).eval()
    x = torch.randn(4, 16)
    buffer = io.BytesIO()
    torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17)
    proto = onnx.load_from_string(buffer.getvalue())
    node = next(n for n in proto.graph.node if n.name.startswith(f"/blocks/blocks.{blocks // 3}/fc/"))
    proto = plant.perturb_initializer(proto, plant.weight_of(proto, node.name), rel=0.05)
    started = time.perf_counter()
    report = onnx_bisect.bisect(model, (x,), onnx=proto, extractable=False)
    return report, time.perf_counter() - started


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    sys.exit("headless Chromium is not installed (apt-get install chromium)")


def timed_copy(html: str, folder: Path) -> Path:
    """The page with the timing script added (and allowed by the page's Content-Security-Policy)."""
    digest = base64.b64encode(hashlib.sha256(TIMING.encode()).digest()).decode()
    html = re.sub(r"script-src ('sha256-[^']+')", rf"script-src \1 'sha256-{digest}'", html, count=1)
    path = folder / "timed.html"
    path.write_text(html.replace("</body>", f"<script>{TIMING}</script></body>"))
    return path


def render_ms(page: Path, profile: Path) -> tuple[float, int, float]:
    """``(render ms, table rows, wall s)`` of one headless Chromium load of ``page``."""
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
            "--enable-logging=stderr", "--v=0", "--dump-dom", page.resolve().as_uri()]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - started
    found = re.search(r"render-ms (\S+) layers (\d+)", proc.stderr)
    if not found:
        sys.exit(f"no timing in Chromium's output: {proc.stderr[-1000:]}")
    return float(found.group(1)), int(found.group(2)), wall


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=250)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", help="keep the HTML report here")
    parser.add_argument("--screenshot", help="also take a screenshot of the page")
    args = parser.parse_args(argv)
    report, seconds = report_of(args.blocks)
    html = report.to_html()
    fd = report.first_divergence
    print(f"{len(report.layers)} layers; bisection {seconds:.1f} s; first divergence "
          f"{fd.layer.pair.activation.name if fd else None} ({fd.cause.value if fd else '-'})")
    print(f"HTML: {len(html.encode()) / 1e6:.3f} MB ({len(html.encode())} bytes), rendered by Python in "
          f"{_render_seconds(report) * 1000:.0f} ms")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        page = timed_copy(html, folder)
        runs = [render_ms(page, folder / f"profile{i}") for i in range(args.runs)]
        rows = {r[1] for r in runs}
        print(f"Chromium render (navigation start to painted after load), {args.runs} runs: median "
              f"{statistics.median(r[0] for r in runs):.0f} ms, max {max(r[0] for r in runs):.0f} ms "
              f"(table rows {rows}); whole chromium process incl. start: median "
              f"{statistics.median(r[2] for r in runs):.2f} s")
        if args.out:
            Path(args.out).write_text(html)
        if args.screenshot:
            plain = folder / "report.html"
            plain.write_text(html)
            subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={args.screenshot}",
                            "--window-size=1280,900", f"--user-data-dir={folder / 'shot'}", plain.resolve().as_uri()],
                           capture_output=True, timeout=120)
    return 0


def _render_seconds(report) -> float:
    started = time.perf_counter()
    report.to_html()
    return time.perf_counter() - started


if __name__ == "__main__":
    sys.exit(main())
