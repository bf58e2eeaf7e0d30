"""Prints libwaste's logits for a token sequence: ``python -m waste.tools.eval MODEL --ids 1,2,3``.

For people debugging a container and for external checks: it opens the container through
the server's own binding (``waste.adapters.native``, cffi API mode), evaluates the ids in
one call and prints the last position's logits, space-separated or as a JSON list.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from waste.adapters.native import NativeEngine, NativeOptions
from waste.adapters.native.options import KERNELS
from waste.domain.ports import EngineError

PROG = "python -m waste.tools.eval"


class IdsError(ValueError):
    """``--ids`` is not a list of token ids of the model; the message names the entry."""


def parse_ids(text: str) -> list[int]:
    """Comma-separated decimal integers (blanks around commas allowed), at least one.

    Raises:
        IdsError: an empty list or an entry that is not an integer, naming it.
    """
    ids = []
    for index, item in enumerate(text.split(",")):
        try:
            ids.append(int(item.strip()))
        except ValueError:
            raise IdsError(f"--ids[{index}] = {item.strip()!r} is not an integer") from None
    return ids


def check_ids(ids: Sequence[int], vocab: int) -> None:
    """Refuse an id outside ``0..vocab-1``, naming its position.

    Raises:
        IdsError: the first id out of range.
    """
    for index, token in enumerate(ids):
        if not 0 <= token < vocab:
            raise IdsError(f"--ids[{index}] = {token} is not a token id of this model (0..{vocab - 1})")


def last_logits(model: str, ids: Sequence[int], options: NativeOptions) -> list[float]:
    """Opens ``model``, evaluates ``ids`` from position 0 and returns the last logits.

    Raises:
        IdsError: an id outside the vocabulary (checked before anything is evaluated).
        EngineError: the container cannot be opened or evaluated (status and detail).
    """
    with NativeEngine.open(model, options) as engine:
        check_ids(ids, engine.model_info().vocab)
        return engine.eval(ids)


def main(argv: list[str] | None = None) -> int:
    """The command line; exit 0 with the logits, 1 on an engine error, 2 on a usage error."""
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a model.waste container directory")
    ap.add_argument("--ids", required=True, help="comma-separated token ids, e.g. 1,2,3")
    ap.add_argument("--json", action="store_true", help="print a JSON list")
    ap.add_argument("--kernels", choices=KERNELS, default="auto", help="kernel set (default auto)")
    ap.add_argument("--threads", type=int, default=0, help="threads (default 0: one per CPU)")
    args = ap.parse_args(argv)
    try:
        ids = parse_ids(args.ids)
        options = NativeOptions(kernels=args.kernels, n_threads=args.threads, usage_path="")
    except ValueError as exc:  # IdsError, or an option NativeOptions refuses (naming it)
        ap.error(str(exc))
    try:
        logits = last_logits(args.model, ids, options)
    except IdsError as exc:
        ap.error(str(exc))
    except EngineError as exc:
        print(f"eval: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(logits))
    else:
        print(" ".join(f"{x:.6g}" for x in logits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
