"""The README's first run walked literally in a browser, on the embedded default started as `scripts/start` starts
it: launch the example, kill its box and hang the next with the commands the run page gives, serve the adapter, a
signed webhook at the demo receiver, the reaper's dry run; the product restarted mid-way loses nothing."""

import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.browser.conftest import chromium, needs_chromium
from tests.test_embedded_start import _free_port

ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "newcomer", "first-run-pass-123"
# Shorter waits than a person's product keeps, none of them a step of the README: boxes boot in 10 s (still longer
# than the run page's refresh, so that "recovering" shows), the sync, the supervisor and the probes come every few
# seconds, and a hung box is given up on after 12 s without heartbeats.
QUICK = {"SIMULATOR_BOOT_DELAY_S": "10", "OFFER_REFRESH_SECONDS": "5", "INSTANCE_SYNC_SECONDS": "2",
         "SUPERVISOR_SECONDS": "2", "AGENT_HEARTBEAT_TIMEOUT_S": "12", "PROBE_SECONDS": "5",
         "INFERENCE_FLEET_SECONDS": "5", "PROBE_TIMEOUT_S": "3", "WEBHOOK_BACKOFF_BASE_S": "1",
         "WEB_WORKERS": "1", "WORKER_CONCURRENCY": "2"}


class Product:
    """`scripts/start` in its own process group on one data folder; started again, it keeps that folder."""

    def __init__(self, data_dir: Path):
        self.env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
        self.env.update(QUICK, DATA_DIR=str(data_dir), PORT=str(_free_port()), SIMULATOR_PORT=str(_free_port()),
                        OPERATOR_USERNAME=USER, OPERATOR_PASSWORD=PASSWORD)
        self.output: list[str] = []
        self.process: subprocess.Popen | None = None

    def start(self) -> str:
        self.process = process = subprocess.Popen([str(ROOT / "scripts" / "start")], cwd=ROOT, env=self.env,
                                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                  start_new_session=True)
        ready = threading.Event()

        def read():
            for line in process.stdout:
                self.output.append(line)
                if "The dashboard is up" in line:
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(240):
            pytest.fail("the product did not come up:\n" + self.tail())
        return re.search(r"open (http://\S+/)", "".join(self.output)).group(1)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def tail(self, lines: int = 80) -> str:
        return "".join(self.output[-lines:])


@pytest.fixture
def product(tmp_path):
    started = Product(tmp_path / "data")
    try:
        yield started
    finally:
        started.stop()


def until(what: str, check, product: Product, timeout_s: float, page=None):
    """check()'s first truthy answer, asked twice a second (the page's live regions refresh every 5 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            seen = page.text_content("main") if page is not None else ""
            pytest.fail(f"{what}: not within {timeout_s:.0f} s\n--- page ---\n{seen[:3000]}\n--- product ---\n"
                        f"{product.tail()}")
        time.sleep(0.5)


def log_in(page, url: str) -> None:
    page.goto(url)
    page.fill("input[name=username]", USER)
    page.fill("input[name=password]", PASSWORD)
    page.click("main button[type=submit]")
    page.wait_for_url(url)


def run_state(page) -> tuple[str, str, int]:
    """(the state the run page shows, its phase, its step) as the live regions show them now."""
    state = page.text_content("#run-state h1 .state") or ""
    progress = re.search(r"(\w+) \(\w+, phase \d+ of \d+\), step (\d+) of", page.text_content("#run-progress") or "")
    return state.strip(), progress.group(1) if progress else "", int(progress.group(2)) if progress else 0


def copied(page, which: str) -> str:
    """The command the run page gives, through its Copy button and the clipboard."""
    text = page.text_content(f"#{which}-command").strip()
    page.click(f"button[data-copy={which}-command]")
    assert page.evaluate("navigator.clipboard.readText()") == text
    return text


def run_command(command: str) -> str:
    done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def boxes_listed(page, url: str) -> dict[str, str]:
    """{label: provider and id} of every box the Instances page lists, live or ended."""
    page.goto(url + "instances/")
    return {row.query_selector("a").text_content().strip(): row.query_selector("td:nth-child(4)").text_content()
            for row in page.query_selector_all("tr[data-instance]") if row.query_selector("a")}


def _trains_on_a_new_box(page, product: Product, old_box: str, after_step: int = 0):
    """Waits for "recovering", then for training again on another box; returns that box's id."""
    until("the run to say recovering", lambda: run_state(page)[0].startswith("recovering"), product, 90, page)
    until("training again on a new box", lambda: run_state(page)[0] == "training" and run_state(page)[2] > after_step
          and page.text_content("#box-provider-id").strip() not in (old_box, "(not rented yet)"), product, 240, page)
    return page.text_content("#box-provider-id").strip()


@pytest.mark.slow
@pytest.mark.timeout(1100)  # several minutes on a loaded 2-core machine; the paced CPT phase alone trains 1.5
@needs_chromium
def test_a_newcomer_walks_the_readmes_first_run(product):
    url = product.start()
    with chromium() as browser:
        context = browser.new_context()
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url.rstrip("/"))
        page = context.new_page()
        log_in(page, url)

        # 1. Offers lists what the simulated marketplace offers.
        def offers_listed():
            page.goto(url + "offers/")
            return page.query_selector("tr[data-offer]")

        until("offers listed", offers_listed, product, 90, page)

        # 2. Runs -> Launch a run, with the example as the page starts it; the page shows training steps.
        page.goto(url + "runs/")
        page.click("text=Launch a run")
        page.click("form.launch button[type=submit]")
        page.wait_for_url(re.compile(r"/runs/\d+/$"))
        run_url = page.url
        until("a first training step", lambda: run_state(page)[:2] == ("training", "cpt") and run_state(page)[2] >= 1,
              product, 240, page)
        # Past the first checkpoint (every 6), as a person reaches step 3 of the README while CPT still trains.
        until("CPT past its first checkpoint", lambda: run_state(page)[2] >= 8, product, 120, page)
        assert run_state(page)[1] == "cpt"

        # 3. Kill the box with the command its page gives.
        first_box = page.text_content("#box-provider-id").strip()
        kill = copied(page, "kill")
        assert kill == f"curl -X POST http://127.0.0.1:{product.env['SIMULATOR_PORT']}/_sim/instances/{first_box}/kill"
        assert '"success": true' in run_command(kill)
        _trains_on_a_new_box(page, product, first_box, after_step=6)

        # The product restarted mid-way: the run and every box it knew are still there, and the run goes on.
        boxes_before = boxes_listed(page, url)
        page.goto(run_url)
        _, phase_before, step_before = run_state(page)
        product.stop()
        assert product.start() == url
        page.goto(run_url)
        if "/login/" in page.url:
            log_in(page, url)
            page.goto(run_url)
        assert run_state(page)[1] == phase_before and run_state(page)[2] >= step_before - 6
        assert boxes_listed(page, url).items() >= boxes_before.items()
        page.goto(run_url)
        until("training again after the restart", lambda: run_state(page)[0] == "training"
              and run_state(page)[2] > step_before, product, 240, page)

        # 3. Hang the box it trains on now, likewise.
        hung_box = page.text_content("#box-provider-id").strip()
        assert run_state(page)[1] == "cpt", "the CPT phase ended before the hang step could be done"
        assert '"success": true' in run_command(copied(page, "hang"))
        _trains_on_a_new_box(page, product, hung_box)

        # Its last phase evaluates the adapter against the base model: a model load and two generations per record.
        until("the run to finish", lambda: run_state(page)[0] == "finished", product, 600, page)

        # 4. Serve it from the finished run's page; the Inference page shows its probe ok with the adapter on its base.
        page.goto(run_url)
        page.click("#serve-adapter a")
        adapter = page.input_value("input[name=name]")
        page.click("#serve-adapter-form button[type=submit]")
        page.wait_for_url(url + "inference/")

        def probed_ok():
            page.goto(url + "inference/")
            row = next((r for r in page.query_selector_all("#serving-boxes tr[data-instance]")
                        if adapter in r.text_content()), None)
            return row is not None and row.query_selector("ul.probes li").text_content().startswith("ok") \
                and re.search(rf"\S+, {re.escape(adapter)}", row.text_content())

        until("the serving box's probe ok with the adapter listed", probed_ok, product, 240, page)

        # 5. Alerts: the demo receiver the page names, a test sent, and it lands signed.
        page.goto(url + "alerts/")
        receiver = page.text_content("#demo-receiver code").strip()
        page.fill("input[name=name]", "demo")
        page.fill("input[name=url]", receiver)
        page.click("form.endpoint-form button[type=submit]")
        listing = page.text_content("#demo-listing").strip()
        page.click("#webhook-endpoints button:has-text('Send test')")

        def landed_signed():
            deliveries = json.loads(run_command(listing))["deliveries"]
            return deliveries and deliveries[0]["signature"] == "valid" and deliveries[0]["body"]["type"] == "test"

        until("a signed test delivery at the demo receiver", landed_signed, product, 60, page)

    # The reaper's dry run, on the same data folder: every live box with its decision and reason, and a count.
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "manage.py", "reap", "--dry-run"], cwd=ROOT,
                          env=product.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    boxes = [line for line in lines[:-1] if line.startswith("(dry run) ")]
    assert boxes and all(re.match(r"\(dry run\) (kept|would destroy|would move) \S+: \w.+", line) for line in boxes)
    assert any("serving, 0 failed probes" in line for line in boxes), done.stdout
    assert re.fullmatch(r"\(dry run\) (nothing to reap|would reap \d+ \(.*\)): \d+ box(es)? checked, \d+ kept",
                        lines[-1]), done.stdout
