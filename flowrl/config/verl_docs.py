"""``docs/verl-keys.md``: the table of :mod:`flowrl.config.verl_keys` as a document, one section per
class (mapped, accepted with no effect, refused by name) and the values refused by name.

Written by ``python -m flowrl.config.verl_keys --write docs/verl-keys.md``; a unit test checks
that the checked-in file is what :func:`document` renders, so the table and its documentation
cannot drift apart. A pure function of the table (passed in: this module imports no table).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable

HEADER = """# verl's configuration keys in flowrl

Generated from the table in `flowrl/config/verl_keys.py` (merged there from its parts,
`flowrl/config/verl_keys_*.py`: trainer, actor, rollout, critic_reward, fsdp, megatron) by
`python -m flowrl.config.verl_keys --write docs/verl-keys.md` (without `--write` it prints); a unit
test checks that this file is what the command writes, so edit the table, not this file.

Every leaf of verl 0.9.1's generated trainer configs (`_generated_ppo_trainer.yaml`,
`_generated_ppo_megatron_trainer.yaml`) is in one of three classes. A key ending in `.*` covers
every key under it; an exact key wins over a prefix, a longer prefix over a shorter one. A verl key
not listed here that is also a flowrl key (`trainer.save_freq`, `algorithm.adv_estimator`) sets
that key.
"""

SECTIONS = {
    "mapped": ("Mapped", "The value sets the flowrl setting that does the same.",
               ("verl key", "flowrl setting", "what it does")),
    "noop": ("Accepted, no effect", "A knob of verl's own implementation: accepted, and noted once at start.",
             ("verl key", "what it does in verl", "why it changes nothing in flowrl")),
    "refuse": ("Refused by name", "A feature flowrl lacks: any value but those accepted (verl's \"off\", which is "
               "what flowrl does, and verl's default) is an error naming it.",
               ("verl key", "the feature flowrl lacks", "values accepted", "nearest flowrl setting")),
}


@lru_cache(maxsize=1)
def _flowrl_keys() -> frozenset[str]:
    from flowrl.config.fields import describe_fields

    return frozenset(key for key, _, _ in describe_fields())


def _exists(dotted: str) -> bool:
    """``dotted`` is a flowrl key, or a section holding some."""
    return dotted in _flowrl_keys() or any(k.startswith(dotted + ".") for k in _flowrl_keys())


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text.replace("|", "\\|").replace("\n", " ") or "-"


def row(entry: Any) -> tuple[str, tuple[str, ...]]:
    """``(section, cells)`` of one table entry (a ``dyn`` entry is mapped once its flowrl field exists)."""
    key = f"`{entry.verl}`"
    if entry.kind == "map" or (entry.kind == "dyn" and _exists(entry.flowrl.removesuffix(".*"))):
        return "mapped", (key, f"`{entry.flowrl}`", _cell(entry.does))
    if entry.kind == "derive":
        return "mapped", (key, "read with other keys", _cell(entry.does))
    if entry.kind == "noop":
        return "noop", (key, _cell(entry.does), _cell(entry.nearest))
    pending = f"; flowrl's `{entry.flowrl}` is not implemented yet" if entry.kind == "dyn" else ""
    accepted = ", ".join(f"`{v!r}`" for v in entry.accept) if entry.accept else "verl's default"
    return "refuse", (key, _cell(entry.does) + pending, _cell(accepted), _cell(entry.nearest))


def document(entries: Iterable[Any], refused_values: dict[tuple[str, str], tuple[str, str]]) -> str:
    """The text of ``docs/verl-keys.md`` for the table ``entries`` (:data:`~flowrl.config.verl_keys.VERL_KEYS`)
    and ``refused_values`` (:data:`~flowrl.config.verl_keys.REFUSED_VALUES`), each section sorted by key."""
    rows: dict[str, list[tuple[str, ...]]] = {name: [] for name in SECTIONS}
    for entry in sorted(entries, key=lambda e: e.verl):
        section, cells = row(entry)
        rows[section].append(cells)
    out = [HEADER]
    for name, (title, intro, heads) in SECTIONS.items():
        out += [f"## {title} ({len(rows[name])})", "", intro, "", "| " + " | ".join(heads) + " |",
                "|" + "---|" * len(heads), *("| " + " | ".join(cells) + " |" for cells in rows[name]), ""]
    out += ["## Values refused by name", "", "A value of a mapped key that names a feature flowrl lacks.", "",
            "| flowrl key | value | the feature flowrl lacks | fix |", "|---|---|---|---|"]
    out += [f"| `{key}` | `{value}` | {_cell(what)} | {_cell(fix)} |"
            for (key, value), (what, fix) in sorted(refused_values.items())]
    return "\n".join(out) + "\n"



def write_document(argv: list[str] | None, keys: Iterable[Any], refused_values: dict) -> int:
    """``python -m flowrl.config.verl_keys [--write PATH]`` of the table ``keys``: print (or write)
    ``docs/verl-keys.md``."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m flowrl.config.verl_keys", description=write_document.__doc__)
    parser.add_argument("--write", metavar="PATH", help="write the document to PATH instead of printing it")
    args = parser.parse_args(argv)
    text = document(keys, refused_values)
    if args.write:
        Path(args.write).write_text(text)
    else:
        print(text, end="")
    return 0
