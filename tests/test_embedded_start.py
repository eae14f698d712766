"""Starts the product exactly as the README's first command does, on a fresh data folder, and uses it over HTTP."""

import os
import re
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def embedded(tmp_path):
    port, sim_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    env.update(DATA_DIR=str(tmp_path / "data"), PORT=str(port), SIMULATOR_PORT=str(sim_port),
               OPERATOR_USERNAME="newcomer", OPERATOR_PASSWORD="first-login-pass", WEB_WORKERS="1",
               WORKER_CONCURRENCY="1", OFFER_REFRESH_SECONDS="5")
    process = subprocess.Popen([str(ROOT / "scripts" / "start")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output: list[str] = []
    ready = threading.Event()

    def read():
        for line in process.stdout:
            output.append(line)
            if "The dashboard is up" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(240):
            pytest.fail("the product did not come up:\n" + "".join(output[-60:]))
        url = re.search(r"open (http://\S+/)", "".join(output)).group(1)
        yield url, output, tmp_path / "data" / "db.sqlite3"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.slow
def test_it_starts_and_lists_offers_after_login(embedded):
    url, output, database = embedded
    with httpx.Client(base_url=url, timeout=10, follow_redirects=True) as browser:
        login_page = browser.get("/")
        assert "Log in" in login_page.text  # anonymous visitors land on the login form
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page.text).group(1)
        dashboard = browser.post("/login/", data={"username": "newcomer", "password": "first-login-pass",
                                                  "csrfmiddlewaretoken": token, "next": "/"},
                                 headers={"Referer": url + "login/"})
        for label in ["Offers", "Instances", "Runs", "Inference fleet", "Alerts", "Admin"]:
            assert f">{label}</a>" in dashboard.text
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            offers = browser.get("/offers/")
            rows = re.findall(r'data-offer="(\d+)"', offers.text)
            if rows:
                break
            time.sleep(1)
        else:
            pytest.fail("no offers were listed:\n" + "".join(output[-60:]))
        assert "H200" in offers.text and "RTX PRO 6000" in offers.text
        assert browser.get("/static/css/app.css").status_code == 200
        assert browser.get("/admin/").status_code == 200


@pytest.mark.slow
def test_it_refreshes_offers_on_the_beat_schedule(embedded):
    url, output, database = embedded
    deadline = time.monotonic() + 60
    refreshes = 0
    while time.monotonic() < deadline and refreshes < 3:
        time.sleep(1)
        with sqlite3.connect(database, timeout=10) as db:
            refreshes = db.execute("select count(*) from fleet_offerrefresh where error = ''").fetchone()[0]
    # one refresh at start, the rest from beat every 5 s
    assert refreshes >= 3, "".join(output[-40:])


@pytest.mark.slow
def test_its_start_output_has_no_warnings(embedded):
    url, output, database = embedded
    deadline = time.monotonic() + 90
    # up to the worker's first task done and beat's first tick: every part has started and connected by then
    while time.monotonic() < deadline and not ("beat: Starting" in "".join(output)
                                               and "refresh_offers" in "".join(output) and
                                               " succeeded in " in "".join(output)):
        time.sleep(1)
    time.sleep(3)
    warnings = [line for line in output if re.search(r"warn", line, re.IGNORECASE)]
    assert "beat: Starting" in "".join(output) and " succeeded in " in "".join(output), "".join(output[-40:])
    assert warnings == [], "".join(output)


@pytest.mark.slow
def test_its_first_setup_installs_the_product_without_warnings(tmp_path):
    # scripts/setup's install of the product itself, as it runs it, into a fresh environment that borrows the
    # checkout's setuptools (no build isolation, as there): the rest of a first setup is the locked packages.
    line = next(line.strip() for line in (ROOT / "scripts" / "setup").read_text().splitlines()
                if line.strip().endswith("--no-build-isolation -e ."))
    settings = dict(re.findall(r'(\w+)="([^"]*)"', line.split('"${pip[@]}"')[0]))
    subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "venv", str(tmp_path / "venv")], check=True)
    import setuptools

    env = {**os.environ, **settings, "PYTHONPATH": str(Path(setuptools.__file__).parent.parent)}
    result = subprocess.run([str(tmp_path / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet",
                             "--disable-pip-version-check", "--no-deps", "--no-build-isolation", "-e", str(ROOT)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert not re.search("warn", result.stdout + result.stderr, re.IGNORECASE), result.stdout + result.stderr
