"""Corruption stays local: every command and listing over a corpus of damaged databases.

Issue 19 points 4 and 5 (read side), R-LIST-14, R-LIST-15, R-LIST-18, R-ERR-1. Each
case of :mod:`make_corpus` is a healthy database written by the real store, then
damaged by hand. Over each, ``subagents tree`` / ``tree --json`` / ``show`` /
``show --json`` (in-process through the CLI's ``main``, and as real processes for a
few) and a runtime's ``list_children`` / ``list_descendants`` (on both backends)
must:

* never raise or print a traceback;
* exit as documented: 0 clean, 1 printed with diagnostics, 2 one line on stderr
  (``subagents COMMAND: [CODE] ...``);
* name every damaged session in a diagnostic (a row keyed by no id by its stored
  key, ``x'0102'``) and still list its healthy siblings and the other trees;
* print strict JSON (no ``NaN``/``Infinity`` literals).

A foreign file (no SQLite header, or another application's SQLite database) is
``NOT_A_DATABASE``; an SQLite file SQLite finds damaged is ``DATABASE_CORRUPT``.
The row cases run on PostgreSQL too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from make_corpus import CASES, FILE_CASES, PG_CASES, Case, build, build_pg
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors._shell._cli import main
from subagents.protocol import ErrorCode, SubagentError
from subagents.store import StoredKey

pytestmark = pytest.mark.timeout(60)

_CLI = "import sys; from subagents.actors._shell._cli import main; sys.exit(main())"


def _refuse(constant: str) -> Any:
    raise AssertionError(f"not strict JSON: {constant}")


def strict(text: str) -> Any:
    """Parse JSON, refusing the NaN / Infinity / -Infinity literals."""
    return json.loads(text, parse_constant=_refuse)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def one_line_error(err: str, command: str, code: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"subagents {command}: [{code}] "), err


def expected_rc(case: Case) -> int:
    return 1 if case.tree_damaged or case.detached else 0


def check_tree_json(case: Case, entries: list[dict[str, Any]]) -> None:
    diagnostics = [d for e in entries for d in e["diagnostics"]]
    assert {d["id"] for d in diagnostics} == case.tree_damaged, diagnostics
    assert {e["id"]: e["detached"] for e in entries if e["detached"]} == case.detached
    listed = {e["id"] for e in entries} | {r["id"] for e in entries for r in e["descendants"]}
    assert case.healthy <= listed, case.healthy - listed
    code = case.extra.get("code_in_detail")
    if code is not None:
        assert all(f"[{code}]" in d["detail"] for d in diagnostics), diagnostics


@pytest.mark.parametrize("name", CASES)
def test_tree(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 19 points 4.1-4.4, R-LIST-14, R-LIST-18, R-ERR-1: ``subagents tree`` and
    ``tree --json`` over each damaged database: the damaged sessions named, the
    healthy ones and the other trees listed, the documented exit status; a file
    nothing can be read from is one typed line, and a refused file is untouched."""
    case = build(name, tmp_path)
    before = Path(case.where).read_bytes()
    code, out, err = run(capsys, "tree", case.where)
    if case.error is not None:
        assert code == 2 and out == ""
        one_line_error(err, "tree", case.error)
        assert run(capsys, "tree", case.where, "--json")[0] == 2
        if case.error == ErrorCode.NOT_A_DATABASE or name == "truncated":
            assert Path(case.where).read_bytes() == before  # refused before opening it
        return
    assert (code, err) == (expected_rc(case), "")
    for damaged in case.tree_damaged:
        assert f"] {damaged}: " in out, (damaged, out)
    for healthy in case.healthy:
        assert healthy in out
    code, out, err = run(capsys, "tree", case.where, "--json")
    assert (code, err) == (expected_rc(case), "")
    check_tree_json(case, strict(out))


@pytest.mark.parametrize("name", CASES)
def test_show(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 19 point 4.6, R-ERR-1: ``subagents show`` prints what decodes and one
    diagnostic per damaged row (a header that does not decode, an event, a gap, a
    damaged page), exit 1; ``--json`` is strict (issue 19 point 4.5: NaN and the
    infinities are the strings "NaN", "Infinity", "-Infinity")."""
    case = build(name, tmp_path)
    if case.error is not None:
        code, _out, err = run(capsys, "show", case.where, str(case.ids.root.id))
        assert code == 2
        one_line_error(err, "show", case.error)
        return
    assert case.show is not None
    sid, seqs = case.show
    code, out, err = run(capsys, "show", case.where, sid)
    assert (code, err) == (1 if seqs else 0, "")
    assert f"session {sid}" in out
    code, out, err = run(capsys, "show", case.where, sid, "--json")
    assert (code, err) == (1 if seqs else 0, "")
    data = strict(out)
    assert [d["seq"] for d in data["diagnostics"]] == seqs
    assert (data["header"] is None) == (-1 in seqs)
    decoded = [e for e in data["events"] if "type" in e]
    assert decoded or name == "events_page_corrupt"  # what decodes is printed
    if name == "non_finite":
        (content,) = [e["content"] for e in decoded if isinstance(e.get("content"), dict)]
        assert content == {"nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "fine": 1.5}


@pytest.mark.parametrize("name", ["bad_key", "corrupt_root_header", "page_corrupt", "empty"])
def test_real_processes(name: str, tmp_path: Path) -> None:
    """Issue 19 point 4: the installed entry point as a real process -- exit status,
    no traceback, and one ``[CODE]`` line for a file nothing can be read from."""
    case = build(name, tmp_path)
    alpha = str(case.ids.alpha.id)
    for args in (["tree", case.where, "--json"], ["show", case.where, alpha, "--json"]):
        proc = subprocess.run(
            [sys.executable, "-c", _CLI, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        if case.error is not None:
            assert proc.returncode == 2 and proc.stdout == ""
            one_line_error(proc.stderr, args[0], case.error)
        elif args[0] == "tree":
            assert proc.returncode == expected_rc(case), proc.stderr
            check_tree_json(case, strict(proc.stdout))
        else:
            assert proc.returncode == 0, proc.stderr
            assert strict(proc.stdout)["header"]["id"] == alpha


def check_listings(case: Case, rt: Runtime) -> None:
    for want in case.listings:
        if want.children:
            listing = rt.subagents.list_children(want.parent)
        else:
            listing = rt.subagents.list_descendants(want.parent)
        assert [str(r.id) for r in listing.rows] == want.rows, (want, listing)
        assert {str(d.id) for d in listing.diagnostics} == want.diagnostics, (want, listing)
        for diag in listing.diagnostics:
            assert isinstance(diag.id, StoredKey) == diag.id.startswith("x'")
            assert diag.kind in ("corrupt", "unavailable")
            code = case.extra.get("code_in_detail")
            assert code is None or f"[{code}]" in diag.detail


@pytest.mark.parametrize("name", CASES)
def test_listings(name: str, backend: Backend, tmp_path: Path) -> None:
    """Issue 19 points 4.1-4.3, R-LIST-14, R-LIST-15, R-LIST-18, R-LIST-19, R-ERR-1:
    a runtime on each damaged database lists rows and diagnostics and raises
    nothing: a row keyed by no id is a diagnostic naming its ``StoredKey``, a loop
    through the listed root is named, a parent column that disagrees with its
    header is a diagnostic of the parent it names; a file no store can use is
    refused with its code."""
    case = build(name, tmp_path)
    if case.runtime_error is not None:
        with pytest.raises(SubagentError) as info:
            Runtime(case.where, backend=backend)
        assert info.value.code == case.runtime_error
        return
    with Runtime(case.where, backend=backend) as rt:
        check_listings(case, rt)
        if case.listing_error is not None:
            for listing in (rt.subagents.list_children, rt.subagents.list_descendants):
                with pytest.raises(SubagentError) as info:
                    listing(case.ids.root.id)
                assert info.value.code == case.listing_error
        elif name in FILE_CASES:  # "empty": a store takes it as a new database
            assert rt.subagents.list_children(case.ids.root.id).rows == ()


@pytest.mark.parametrize("name", PG_CASES)
def test_postgres_rows(
    name: str, pg_url: str, backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 19 point 4 on PostgreSQL: the same damaged rows give the same
    diagnostics in ``tree --json``, ``show --json`` and the listings."""
    case = build_pg(name, pg_url)
    code, out, err = run(capsys, "tree", pg_url, "--json")
    assert (code, err) == (expected_rc(case), "")
    check_tree_json(case, strict(out))
    assert case.show is not None
    sid, seqs = case.show
    code, out, err = run(capsys, "show", pg_url, sid, "--json")
    assert (code, err) == (1 if seqs else 0, "")
    assert [d["seq"] for d in strict(out)["diagnostics"]] == seqs
    with Runtime(pg_url, backend=backend) as rt:
        check_listings(case, rt)
