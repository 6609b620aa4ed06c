"""Run a module with kill -9 at a chosen point of its code (bench/faults.py's injector).

    python bench/_kill_at.py 'TARGET[@return]#N[ in WITHIN]' -m ihsweep.steps.train ARGS...

TARGET and WITHIN are ``module:attribute.path`` (``ihsweep.training.loop:Trainer.checkpoint``,
``os:replace``). The process sends itself SIGKILL at the N-th call of TARGET (counted only
while WITHIN runs, when given), as the call starts or, with ``@return``, as it returns. It is
the real signal on the real process: nothing of the job runs after it, not even ``finally``.

A target is wrapped where callers look it up, so a function imported by name is named in the
module that imports it (``ihsweep.training.loop:save_checkpoint``). A point never reached makes
the module run to its end and this script exit with ``NOT_REACHED``.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import runpy
import signal
import sys

NOT_REACHED = 3


def resolve(spec: str):
    """(owner, attribute name) of ``module:a.b.c``: the object holding the attribute."""
    module, path = spec.split(":")
    owner = importlib.import_module(module)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    return owner, name


def wrap(spec: str, make):
    owner, name = resolve(spec)
    original = getattr(owner, name)
    setattr(owner, name, functools.wraps(original)(make(original)))


def install(point: str) -> None:
    match = re.fullmatch(r"(\S+?)(@return)?#(\d+)(?: in (\S+))?", point)
    if match is None:
        raise SystemExit(f"not a point: {point!r} (TARGET[@return]#N[ in WITHIN])")
    target, at_return, nth, within = match[1], bool(match[2]), int(match[3]), match[4]
    inside, calls = [0], [0]

    def kill_if_due():
        if within is None or inside[0] > 0:
            calls[0] += 1
            if calls[0] == nth:
                os.kill(os.getpid(), signal.SIGKILL)

    def make_target(original):
        def target_wrapper(*args, **kwargs):
            if not at_return:
                kill_if_due()
            result = original(*args, **kwargs)
            if at_return:
                kill_if_due()
            return result

        return target_wrapper

    def make_within(original):
        def within_wrapper(*args, **kwargs):
            inside[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                inside[0] -= 1

        return within_wrapper

    wrap(target, make_target)
    if within is not None:
        wrap(within, make_within)


def main() -> None:
    point, flag, module, *argv = sys.argv[1:]
    if flag != "-m":
        raise SystemExit("usage: _kill_at.py POINT -m MODULE ARGS...")
    install(point)
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        if done.code not in (0, None):
            raise
    sys.exit(NOT_REACHED)


if __name__ == "__main__":
    main()
