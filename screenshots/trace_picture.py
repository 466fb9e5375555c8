"""A picture of a run's Perfetto trace (``shardtop report RUN --format perfetto``), as a trace viewer draws it.

    python screenshots/trace_picture.py --catapult DIR [--run RUN] [--out screenshots/trace-kept-logits-oom-h200.png]

The run is the recording of a loop that keeps each step's logits, on one H200, to its OOM at step 90
(``tests/fixtures/runs/h200-over-time/``).  Its trace is turned into a page by catapult's ``trace2html``
(the viewer chrome://tracing is made of; DIR is a checkout of github.com/catapult-project/catapult), opened
in headless Chromium, the OOM found with the viewer's own search box, and the page captured.  Needs
``chromium`` on the PATH and ``aiohttp`` (for Chromium's DevTools protocol).  ui.perfetto.dev opens the same
file; it is a web app that needs the network, so it is not used here.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEPT_LOGITS = ROOT / "tests" / "fixtures" / "runs" / "h200-over-time" / "20261202-003210-kept-logits-56ca"


def trace_page(run: Path, catapult: Path, into: Path) -> Path:
    """The run's trace, as shardtop writes it, and the viewer's page made of it."""
    copy = into / run.name  # report may write next to the run; the recording stays as it was
    shutil.copytree(run, copy)
    trace = into / "trace.json"
    with trace.open("w") as out:
        subprocess.run([sys.executable, "-m", "shardtop", "report", str(copy), "--format", "perfetto"],
                       stdout=out, check=True, cwd=ROOT)
    page = into / "trace.html"
    subprocess.run([sys.executable, str(catapult / "tracing" / "bin" / "trace2html"), str(trace),
                    "--output", str(page)], check=True, capture_output=True)
    return page


FIND_BOX = ("var control = document.querySelector('tr-ui-find-control');"
            "var box = control.querySelector('input')"
            " || (control.shadowRoot && control.shadowRoot.querySelector('input'))"
            " || (control.root && control.root.querySelector('input'))")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def capture(page: Path, png: Path, find: str, width: int, height: int) -> None:
    import aiohttp

    port = free_port()
    chrome = subprocess.Popen(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               f"--window-size={width},{height}", f"--remote-debugging-port={port}", "about:blank"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with aiohttp.ClientSession() as http:
            tabs: list[dict[str, Any]] = []
            for _ in range(150):
                try:
                    async with http.get(f"http://127.0.0.1:{port}/json") as answer:
                        tabs = [t for t in await answer.json() if t["type"] == "page"]
                    if tabs:
                        break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
            async with http.ws_connect(tabs[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                ids = iter(range(1, 1 << 30))

                async def call(method: str, **params: Any) -> dict[str, Any]:
                    n = next(ids)
                    await ws.send_json({"id": n, "method": method, "params": params})
                    async for message in ws:
                        data = json.loads(message.data)
                        if data.get("id") == n:
                            return dict(data.get("result", {}))
                    raise RuntimeError("Chromium closed the connection")

                async def shown(text: str) -> bool:
                    got = await call("Runtime.evaluate", expression=f"document.body.innerText.includes({text!r})")
                    return bool(got.get("result", {}).get("value"))

                await call("Page.navigate", url=page.as_uri())
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and (not await shown("rank 0") or await shown("Importing")):
                    await asyncio.sleep(0.5)
                # the viewer's search box (its find control) selects the first event whose title matches
                await call("Runtime.evaluate", expression=FIND_BOX + "; box.focus()")
                await call("Input.insertText", text=find)
                await asyncio.sleep(1)
                await call("Runtime.evaluate", expression="document.querySelector('tr-ui-find-control').findNext()")
                await asyncio.sleep(2)
                shot = await call("Page.captureScreenshot", format="png")
                png.write_bytes(base64.b64decode(shot["data"]))
    finally:
        chrome.terminate()
        chrome.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catapult", type=Path, required=True, help="a checkout of catapult-project/catapult")
    parser.add_argument("--run", type=Path, default=KEPT_LOGITS)
    parser.add_argument("--find", default="out of memory in", help="the event the viewer selects")
    parser.add_argument("--out", type=Path, default=ROOT / "screenshots" / "trace-kept-logits-oom-h200.png")
    parser.add_argument("--size", default="1600x900")
    args = parser.parse_args()
    width, height = (int(n) for n in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        page = trace_page(args.run.resolve(), args.catapult.resolve(), Path(tmp))
        asyncio.run(capture(page, args.out, args.find, width, height))
    print(args.out)


if __name__ == "__main__":
    main()
