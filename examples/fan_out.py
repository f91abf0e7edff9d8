"""Async fan-out: one job in each of 100 sessions at once, collected as they finish.

Every session gets a `bash` job (with `auto_resume`, so each actor is resumed for it and suspended
after); `AsyncClient.as_completed` long-polls them and yields each job as it ends, fastest first.

    .venv/bin/python examples/fan_out.py [--api-url URL] [--env my-env] [--sessions 100]
"""

from __future__ import annotations

import argparse
import asyncio
import uuid

from atefleet.client import AsyncClient, Job


async def fan_out(api_url: str | None, env: str, sessions: int) -> list[Job]:
    """The jobs, in the order they finished."""
    run_id = uuid.uuid4().hex[:6]
    async with AsyncClient(api_url) as client:
        targets = [client.session(env, f"fan-{run_id}-{i}", auto_resume=True) for i in range(sessions)]
        jobs = await asyncio.gather(*(s.submit("bash", {"command": f"echo session {i}; nproc"})
                                      for i, s in enumerate(targets)))
        finished = []
        async for job in client.as_completed(jobs):
            print(f"{job.session}: {job.state} {(job.result or {}).get('output', '').split()[:2]}")
            finished.append(job)
        await asyncio.gather(*(s.destroy() for s in targets))
        return finished


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api-url", default=None)
    parser.add_argument("--env", default="my-env")
    parser.add_argument("--sessions", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(fan_out(args.api_url, args.env, args.sessions))


if __name__ == "__main__":
    main()
