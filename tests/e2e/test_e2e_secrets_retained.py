"""Sealed env values through the real fleet: a call whose declared values are gone (expired) fails
loudly with `secrets_missing` instead of running with an empty environment."""

from __future__ import annotations

from test_e2e_async import ASYNC, bash, resume, wait_done

from tests.e2e.conftest import RunningFleet


def test_a_call_whose_env_values_are_gone_fails_instead_of_running_bare(fleet: RunningFleet) -> None:
    r = fleet.redis_client()
    with fleet.client() as c:
        base = resume(c, "sec-gone")
        # given a call queued behind a running one, whose sealed values then vanish (as at expiry)
        head = c.post(base, json=bash("sleep 3"), headers=ASYNC).json()
        body = {**bash('echo "[$TOKEN]" >> seen.txt'), "env_variables": [{"name": "TOKEN", "value": "t0k"}]}
        job = c.post(base, json=body, headers=ASYNC).json()
        assert r.exists(f"af:sec:{job['id']}")
        r.delete(f"af:sec:{job['id']}")
        # then it fails with a problem saying so, and its command never ran
        done = wait_done(c, job["id"])
        assert done["state"] == "failed" and done["error"]["type"].endswith("/secrets_missing"), done
        assert wait_done(c, head["id"])["state"] == "succeeded"
        listing = c.post(base, json=bash("cat seen.txt 2>/dev/null || echo none")).json()
        assert listing["output"] == "none\n"
    r.close()
