"""Regenerate the Phoenix screenshots of ``docs/otel-setups.md``.

Starts a real Phoenix on 127.0.0.1 (as ``tests/test_phoenix.py`` does), feeds it the OpenAI
example agent's run and its replay, and takes each picture with Debian's headless Chromium. Run it
with a Python that has ``arize-phoenix`` (``.ci/run`` makes ``.venv-phoenix``); not part of CI:

    apt-get install -y chromium
    .venv-phoenix/bin/python docs/images/make_screenshots.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from phoenix_server import SDK_AGENT, feed, running_phoenix  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Without the background-networking flags Chromium tries hosts this machine cannot reach.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1400,900",
    "--virtual-time-budget=15000",  # Phoenix is a single-page app: let it load its data
]


def screenshot(url: str, path: Path, work: Path) -> None:
    profile = Path(tempfile.mkdtemp(dir=work))  # a fresh profile each time
    subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={path}", url],
        check=True,
        capture_output=True,
        timeout=120,
    )
    print(f"wrote {path.relative_to(ROOT)}")


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        with running_phoenix(work / "phoenix") as phoenix:
            feed(
                SDK_AGENT,
                phoenix.http_endpoint,
                work / "agent",
                OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
            )
            phoenix.wait_for_spans("support-agent", 8)
            spans = phoenix.spans("support-agent")
            (run,) = [s for s in spans if s["name"] == "invoke_agent support_agent"]
            trace_id = run["context"]["trace_id"]
            llm = max(
                (
                    s
                    for s in spans
                    if s["name"] == "chat gpt-4o" and s["context"]["trace_id"] == trace_id
                ),
                key=lambda s: s["start_time"],
            )
            (tool,) = [
                s
                for s in spans
                if s["name"] == "execute_tool lookup_order" and s["context"]["trace_id"] == trace_id
            ]
            project = next(
                p["id"] for p in phoenix.get("/v1/projects")["data"] if p["name"] == "support-agent"
            )
            url = phoenix.url
            screenshot(f"{url}/projects/{project}/traces", HERE / "phoenix-traces.png", work)
            screenshot(f"{url}/redirects/traces/{trace_id}", HERE / "phoenix-trace.png", work)
            screenshot(
                f"{url}/redirects/spans/{llm['context']['span_id']}",
                HERE / "phoenix-llm-span.png",
                work,
            )
            screenshot(
                f"{url}/redirects/spans/{tool['context']['span_id']}",
                HERE / "phoenix-tool-span.png",
                work,
            )


if __name__ == "__main__":
    main()
