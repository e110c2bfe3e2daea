"""`corral load`: the command line around `driver.run_load`. The router is `--router`, else the local
fleet's (`corral up --port`); it is asked for its models first, so a router that does not answer, or
refuses the key, is a one-line error (exit 2) before any load is sent. aiohttp and the driver are
imported when the command runs: `corral --help` stays fast."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import urlparse

import click

if TYPE_CHECKING:
    import aiohttp

    from corral.fleet.load.driver import LoadPlan
    from corral.fleet.load.tally import LoadTally

EXIT_CODES = """Exit code: 0 when every request the load sent succeeded (a Ctrl-C stop included); 1 when
any failed (the summary counts them by kind: HTTP status, connection error or closed, stream cut,
stream error event, timeout); 2 for a bad option or a router that cannot be reached or asked."""

MAX_CONCURRENCY = 512  # as driver.MAX_IN_FLIGHT (imported when the command runs)


def _fail(message: str) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    raise SystemExit(2)


def _positive(name: str, value: float | None, example: str) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        _fail(f"{name} {value} must be a number above 0 ({example})")


def check_options(
    rate: float | None,
    concurrency: int | None,
    seconds: float,
    stream_share: float,
    max_requests: int,
    request_timeout: float,
) -> None:
    """Each bad value said by name, with what to give instead."""
    if rate is not None and concurrency is not None:
        _fail("--rate and --concurrency both given: pick one (a fixed rate, or a number of clients)")
    _positive("--rate", rate, "requests a second, e.g. --rate 10")
    if concurrency is not None and not 1 <= concurrency <= MAX_CONCURRENCY:
        _fail(f"--concurrency {concurrency} must be 1 to {MAX_CONCURRENCY} (clients, e.g. --concurrency 8)")
    _positive("--seconds", seconds, "how long to send, e.g. --seconds 30")
    if not (0.0 <= stream_share <= 1.0):  # NaN fails this too
        _fail(f"--stream-share {stream_share} must be between 0 and 1 (the streamed share, e.g. 0.5)")
    if max_requests < 1:
        _fail(f"--max-requests {max_requests} must be 1 or more")
    _positive("--timeout", request_timeout, "seconds a request may take, e.g. --timeout 60")


def router_url(router: str | None, port: int) -> str:
    """`--router` checked, or the local fleet's router (from `corral up`'s fleet file)."""
    import orjson

    from corral.state_home import local_fleet_file

    if router is None:
        path = local_fleet_file(port)
        try:
            router = str(orjson.loads(path.read_bytes())["router"])
        except FileNotFoundError:
            _fail(
                f"no --router given and no local fleet on port {port} ({path} does not exist): "
                "start one with `corral up`, or pass --router URL"
            )
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
            _fail(f"{path} names no router ({type(exc).__name__}): pass --router URL")
    parsed = urlparse(router)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        _fail(f"--router {router!r} is not an http(s) URL: pass one like http://127.0.0.1:8000")
    return router.rstrip("/")


async def served_model(
    session: aiohttp.ClientSession, router: str, headers: dict[str, str], model: str | None
) -> str:
    """The model to load: `model` when the router serves it, else the first it lists; exits 2 saying
    why when the router cannot be asked."""
    import aiohttp
    import orjson

    try:
        async with session.get(
            router + "/v1/models", headers=headers, timeout=aiohttp.ClientTimeout(total=10)
        ) as resp:
            body = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        _fail(
            f"cannot reach the router at {router} ({type(exc).__name__}): is the fleet up "
            "(`corral status`)? pass --router URL of a running router"
        )
    if status == 401 and "Authorization" in headers:
        _fail(
            f"the router at {router} refused the key in --api-key-file (401): it must be a key from "
            "the router's --api-keys-file"
        )
    if status == 401:
        _fail(f"the router at {router} wants an API key (401): pass --api-key-file FILE")
    if status != 200:
        _fail(f"the router at {router} answered /v1/models with HTTP {status}: is it a Corral router?")
    try:
        listed = [str(m["id"]) for m in orjson.loads(body)["data"]]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        _fail(f"the router at {router} answered /v1/models with no model list: is it an OpenAI router?")
    if model is not None and model not in listed:
        _fail(f"--model {model!r} is not served by {router} (it serves: {', '.join(listed) or 'none'})")
    if model is None and not listed:
        _fail(
            f"the router at {router} serves no model yet: wait for an engine "
            "(`corral status`), or pass --model"
        )
    return model or listed[0]


def _progress(tally: LoadTally, elapsed: float, window: float) -> None:
    click.echo(tally.progress_line(elapsed, window))


async def _load(
    plan: LoadPlan, router: str, model: str | None, headers: dict[str, str]
) -> tuple[LoadTally, float, bool]:
    import asyncio
    import dataclasses
    import signal

    import aiohttp

    from corral.fleet.load.driver import run_load

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            chosen = await served_model(session, router, headers, model)
            plan = dataclasses.replace(plan, model=chosen)
            how = f"{plan.rate:g} req/s" if plan.rate is not None else f"{plan.concurrency} clients"
            click.echo(
                f"load: {how} of {chosen} to {router} for {plan.seconds:g}s (at most {plan.max_requests} "
                f"requests, {plan.stream_share:.0%} streamed); Ctrl-C stops it"
            )
            tally, elapsed = await run_load(plan, session, stop, _progress)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)
    return tally, elapsed, stop.is_set()


@click.command(epilog=EXIT_CODES)
@click.option("--router", default=None, help="Router URL (default: the local fleet's, from `corral up`).")
@click.option("--port", default=8000, show_default=True, help="Router port of the local fleet (`corral up`).")
@click.option(
    "--rate",
    type=float,
    default=None,
    help="Requests started each second (default 10 when no --concurrency).",
)
@click.option(
    "--concurrency",
    type=int,
    default=None,
    help="Clients, each sending its next request when its last one ends.",
)
@click.option("--seconds", type=float, default=10.0, show_default=True, help="How long to send.")
@click.option(
    "--max-requests", type=int, default=100_000, show_default=True, help="Stop after this many requests."
)
@click.option(
    "--stream-share",
    type=float,
    default=0.5,
    show_default=True,
    help="Share of the requests streamed (0 to 1).",
)
@click.option("--model", default=None, help="Model to ask for (default: the first the router lists).")
@click.option(
    "--max-tokens",
    type=click.IntRange(1, 4096),
    default=16,
    show_default=True,
    help="max_tokens of each request.",
)
@click.option(
    "--timeout",
    "request_timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds a request may take before it counts as failed.",
)
@click.option(
    "--api-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File holding the router's API key (a tenant key from its --api-keys-file).",
)
def load(
    router: str | None,
    port: int,
    rate: float | None,
    concurrency: int | None,
    seconds: float,
    max_requests: int,
    stream_share: float,
    model: str | None,
    max_tokens: int,
    request_timeout: float,
    api_key_file: Path | None,
) -> None:
    """Send a bounded demo load of chat completions to a router and count what failed.

    A line a second (sent, ok, failed, in flight, req/s and p50/p99 latency of the requests that
    ended in that second), then a summary with each failure's kind. Ctrl-C stops sending, waits a
    few seconds for the requests in flight and prints the summary. Run it in a second terminal during
    `corral rollout` to see that no request fails."""
    from corral.aio import run
    from corral.fleet.load.driver import LoadPlan
    from corral.secret_file import SecretFileError, read_secret_file

    check_options(rate, concurrency, seconds, stream_share, max_requests, request_timeout)
    url = router_url(router, port)
    headers: dict[str, str] = {}
    if api_key_file is not None:
        try:
            headers["Authorization"] = f"Bearer {read_secret_file(api_key_file, '--api-key-file')}"
        except SecretFileError as exc:
            _fail(str(exc))
    plan = LoadPlan(
        url=url + "/v1/chat/completions",
        model=model or "",
        seconds=seconds,
        max_requests=max_requests,
        stream_share=stream_share,
        rate=10.0 if rate is None and concurrency is None else rate,
        concurrency=concurrency,
        max_tokens=max_tokens,
        request_timeout=request_timeout,
        headers=headers,
    )
    tally, elapsed, stopped = run(_load(plan, url, model, headers))
    click.echo(tally.summary_line(elapsed, stopped))
    raise SystemExit(1 if tally.failed else 0)
