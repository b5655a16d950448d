"""The embedded ``raftsched.Scheduler``: a node in this process running Python callables.
(An embedded node beside a node process: tests/cluster/test_embedded_ports.py.)"""

from __future__ import annotations

import threading

import pytest

import raftsched
from tests.support.harness import free_ports, wait_until

pytestmark = pytest.mark.timeout(60)

CALLS: list[raftsched.RunContext] = []
_LOCK = threading.Lock()


def record(ctx: raftsched.RunContext) -> str:
    with _LOCK:
        CALLS.append(ctx)
    return f"ran {ctx.run_id}"


def test_embedded_scheduler_runs_a_registered_callable_with_its_context(tmp_path):
    raft_port, api_port = free_ports(2)
    with raftsched.Scheduler(data_dir=str(tmp_path / "data"), raft=f"127.0.0.1:{raft_port}",
                             api=f"127.0.0.1:{api_port}") as sched:
        sched.add_job(record, id="embedded", schedule={"every": "1s"})
        wait_until(lambda: len(CALLS) >= 2, 15, "two calls")
        runs = sched.client.runs("embedded")["runs"]
    first = CALLS[0]
    assert first.job_id == "embedded" and first.attempt == 1 and first.node_id == "n1"
    assert first.run_id == f"embedded@{first.scheduled_ms}"
    assert first.scheduled_at.endswith("Z")
    done = {r["run_id"]: r for r in runs if r["state"] == "succeeded"}
    assert first.run_id in done and done[first.run_id]["fence"] == first.fence
    assert done[first.run_id]["tail"] == f"ran {first.run_id}"


def test_embedded_defaults_never_share_the_cli_node_s_data_dir_or_ports():
    sched = raftsched.Scheduler()
    node = sched.cfg.nodes[0]
    assert sched.cfg.data_dir == "./raftsched-embedded"
    assert {node.raft, node.api} & {"127.0.0.1:7001", "127.0.0.1:7101"} == set()
    assert node.metrics is None


NOTES: list[str] = []


async def chatty(ctx: raftsched.RunContext) -> str:
    """An async callable: its print and logging output land in its run's tail."""
    import asyncio
    import logging

    print("hello from", ctx.run_id)  # noqa: T201 - the output under test
    logging.getLogger("app.jobs").warning("a warning from %s", ctx.job_id)
    await asyncio.sleep(0)
    return "done"


def broken(ctx: raftsched.RunContext) -> None:
    print("about to fail")  # noqa: T201 - the output under test
    raise ValueError(f"bad input in {ctx.job_id}")


def patient(ctx: raftsched.RunContext) -> None:
    """Waits for its run to end: ctx.cancelled is set when it times out."""
    NOTES.append("cancelled" if ctx.cancelled.wait(30) else "not cancelled")


def test_async_scheduler_output_tracebacks_and_cancelled_runs(tmp_path):
    import asyncio

    raft_port, api_port = free_ports(2)
    NOTES.clear()

    async def main() -> dict[str, list[dict[str, object]]]:
        sched = raftsched.AsyncScheduler(data_dir=str(tmp_path / "data"),
                                         raft=f"127.0.0.1:{raft_port}",
                                         api=f"127.0.0.1:{api_port}")
        sched.job(every="1s", id="chatty")(chatty)
        sched.job(every="1h", id="broken")(broken)
        sched.job(every="1h", id="patient", timeout="1s")(patient)
        async with sched:
            assert sched.role == "node"
            report = await sched.wait_declared(10)
            assert sorted(report.created) == ["broken", "chatty", "patient"]
            await sched.trigger("broken")
            await sched.trigger("patient")

            async def ended(job: str) -> list[dict[str, object]]:
                while True:
                    runs = (await sched.runs(job))["runs"]
                    if any(r["state"] not in ("pending", "assigned", "started") for r in runs):
                        return runs
                    await asyncio.sleep(0.1)

            out = {job: await asyncio.wait_for(ended(job), 20)
                   for job in ("chatty", "broken", "patient")}
            # Declaring the same again (another instance of the app) is no new version.
            again = await sched.add_job(chatty, id="chatty", every="1s")
            assert again["version"] == 1 and not again["changed"]
            return out

    runs = asyncio.run(main())
    chatty_run = next(r for r in runs["chatty"] if r["state"] == "succeeded")
    assert "hello from chatty@" in chatty_run["tail"]
    assert "WARNING app.jobs: a warning from chatty" in chatty_run["tail"]
    assert chatty_run["tail"].endswith("done")
    failed = runs["broken"][0]
    assert failed["state"] == "failed" and failed["reason"] == "raised ValueError"
    assert failed["tail"].startswith("about to fail\nTraceback")
    assert "ValueError: bad input in broken" in failed["tail"]
    assert runs["patient"][0]["state"] == "timed_out"
    wait_until(lambda: NOTES == ["cancelled"], 10, "the timed-out callable to see cancelled")


APP_RUNS: list[str] = []


async def app_tick(ctx: raftsched.RunContext) -> None:
    APP_RUNS.append(ctx.run_id)


def test_async_scheduler_in_an_aiohttp_app_s_startup_and_cleanup(tmp_path):
    """aiohttp: the scheduler starts in on_startup, its jobs run while the app serves,
    and the app's cleanup stops it (a drain) without blocking the app's loop."""
    import asyncio

    from aiohttp import web

    raft_port, api_port, http_port = free_ports(3)
    APP_RUNS.clear()
    sched = raftsched.AsyncScheduler(data_dir=str(tmp_path / "data"),
                                     raft=f"127.0.0.1:{raft_port}", api=f"127.0.0.1:{api_port}")
    sched.job(every="1s", id="app-tick")(app_tick)

    async def runs_view(request: web.Request) -> web.Response:
        return web.json_response(await sched.runs("app-tick"))

    async def main() -> tuple[int, str | None]:
        app = web.Application()
        app.router.add_get("/runs", runs_view)
        app.on_startup.append(lambda _app: sched.start())
        app.on_cleanup.append(lambda _app: sched.stop())
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", http_port).start()
        try:
            await asyncio.wait_for(_until(lambda: len(APP_RUNS) >= 2), 20)
            from aiohttp import ClientSession
            async with ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{http_port}/runs") as resp:
                    body = await resp.json()
        finally:
            await runner.cleanup()
        return len(body["runs"]), sched.role

    count, role_after = asyncio.run(main())
    assert count >= 2 and role_after is None


async def _until(cond) -> None:
    import asyncio
    while not cond():
        await asyncio.sleep(0.05)
