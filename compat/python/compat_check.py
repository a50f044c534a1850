"""Shared by the Python driver checks: where things are, and a tiny runner.

Each check prints "ok NAME" or "FAIL NAME: why"; finish() exits 1 if any
check failed. The Go test (compat/drivers_test.go) sets the environment.
"""
import inspect
import os
import sys
import traceback

PROXY_URL = os.environ["COMPAT_PROXY_URL"]    # through pgfence
DIRECT_URL = os.environ["COMPAT_DIRECT_URL"]  # straight to Postgres
TABLE = os.environ["COMPAT_TABLE"]            # guarded: id, val, n, fence_epoch; rows 1..10 'init'
PLAIN = os.environ["COMPAT_PLAIN_TABLE"]      # unguarded: id, val
CHANNEL = os.environ["COMPAT_CHANNEL"]

# COMPAT_ONLY, if set, names the checks to run (comma-separated).
_only = set(filter(None, os.environ.get("COMPAT_ONLY", "").split(",")))
_failed = []


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def check(name):
    """Decorator: run the function now as check NAME (awaited if async)."""
    def run(fn):
        if _only and name not in _only:
            return fn
        try:
            if inspect.iscoroutinefunction(fn):
                import asyncio
                asyncio.run(fn())
            else:
                fn()
        except Exception as e:  # noqa: BLE001 - any failure fails the check
            _failed.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
        else:
            print(f"ok {name}", flush=True)
        return fn
    return run


def finish():
    sys.exit(1 if _failed else 0)
