"""The stored rankings notebooks 25 and 26 read (tools/plans.py writes them, utils.stored_plans reads them).

Fast: the file's shape, the provenance every entry carries, the search each published row gets, the
comparison ``--check`` uses and the script's bad input. Slow (``make test-slow``): one stored entry computed
again at full size must match, and the table of published plans against the planner is printed.
"""

import importlib.util
import json
import sys

import pytest

from spmd_course.course import ROOT
from spmd_course.utils import stored_plans
from spmd_course.utils.planner import candidates
from spmd_course.utils.published_rows import ROWS

_spec = importlib.util.spec_from_file_location("plans_tool", ROOT / "tools" / "plans.py")
plans_tool = sys.modules["plans_tool"] = importlib.util.module_from_spec(_spec)  # tools/ is not a package
_spec.loader.exec_module(plans_tool)

STORED = stored_plans.load() if stored_plans.STORE.exists() else None
needs_store = pytest.mark.skipif(STORED is None, reason="no data/plans/plans.json: run `make plans`")


def test_a_missing_store_names_make_plans(tmp_path):
    with pytest.raises(FileNotFoundError, match="make plans"):
        stored_plans.load(tmp_path / "plans.json")
    (tmp_path / "other.json").write_text(json.dumps({"course": {}}))
    with pytest.raises(ValueError, match=r"not written by tools/plans\.py"):
        stored_plans.load(tmp_path / "other.json")


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_each_published_row_is_searched_over_its_own_plan_and_one_other(row):
    meshes, remats = plans_tool.published_search(row)
    (_, fsdp, tensor), _ = row.parallelism.resolve(row.chips // row.num_slices, row.num_slices)
    assert meshes[0] == (1, fsdp, tensor) and remats[0] == row.remat  # the published plan is searched
    assert len(set(meshes)) == len(set(remats)) == 2 and (tensor > 1) == (meshes[1][2] == 1)
    found = candidates(row.model, chips_per_slice=row.chips // row.num_slices, num_slices=row.num_slices,
                       sequences=row.per_device_batch * row.chips, remats=remats, meshes=meshes)  # all divide
    assert any((c.fsdp, c.tensor, c.remat, c.per_device_batch, c.accumulation) ==
               (fsdp, tensor, row.remat, row.per_device_batch, 1) for c in found)


def test_check_compares_plans_not_provenance():
    entry = {"plans": [{"step_seconds": 1.0, "status": "fits"}], "top": "a", "command": "x", "cpu_seconds": 3,
             "versions": {"jax": "0.12"}}
    same = {**entry, "plans": [{"step_seconds": 1.0 + 1e-9, "status": "fits"}], "command": "y", "cpu_seconds": 9}
    assert plans_tool.compare(entry, same) == []
    moved = {**entry, "plans": [{"step_seconds": 1.1, "status": "fits"}], "top": "b"}
    assert plans_tool.compare(entry, moved) == ["plans", "top"]


@pytest.mark.parametrize("argv,message", [
    (["--only", "9b-v5e"], "unknown entries"),
    (["--not-run", "v5e 16B 1x v5e-256"], "NAME=REASON"),
    (["--not-run", "no such row=slow"], "NAME=REASON"),
])
def test_bad_arguments_name_the_fix(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        plans_tool.main([*argv, "--store", str(tmp_path / "plans.json")])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "plans.json").exists()


def test_not_run_rows_are_stored_with_their_reason(tmp_path):
    store = tmp_path / "plans.json"
    name = ROWS[0].name
    assert plans_tool.main(["--only", "8b-v5e", "--not-run", f"{name}=out of time", "--store", str(store),
                            "--dry-run"]) == 0
    data = stored_plans.load(store)
    assert data["not_run"] == {name: "out of time"} and data["published"] == {} and data["course"] == {}
    assert f"{name:<21} not run: out of time" in stored_plans.published_table(data)


@needs_store
def test_every_published_row_is_stored_or_listed_as_not_run():
    assert set(STORED["published"]) | set(STORED["not_run"]) == {r.name for r in ROWS}
    assert not set(STORED["published"]) & set(STORED["not_run"])
    assert set(STORED["course"]) <= set(plans_tool.COURSE) and STORED["course"]


@needs_store
def test_every_stored_entry_says_how_it_was_made():
    for entry in [*STORED["course"].values(), *STORED["published"].values()]:
        line = stored_plans.provenance(entry)
        assert line.startswith("stored: `python tools/plans.py --only ") and "libtpu" in line
        assert entry["versions"]["effort"] == entry["effort"] == plans_tool.EFFORT
        assert entry["table"].splitlines()[0].startswith("plans for ")


@needs_store
def test_each_published_entry_places_the_published_plan_and_says_why():
    for name, e in STORED["published"].items():
        place = e["published_place"]
        mine = e["plans"][place - 1]
        _, f, t = e["published_mesh"]
        assert (mine["fsdp"], mine["tensor"], mine["remat"], mine["per_device_batch"]) == (
            f, t, e["published_remat"], e["published_per_device_batch"]), name
        fits = [p for p in e["plans"] if p["status"] == "fits"]
        if e["published_fitting_place"]:
            assert fits[e["published_fitting_place"] - 1] == mine
        if fits:
            assert e["top"] == fits[0]["label"] and e["reason"]
            ratio = e["top_mfu_row_formula"] / fits[0]["mfu"]  # the row's formula against the planner's
            assert 0.5 < ratio < 2.5, name


@needs_store
def test_published_table_has_a_row_and_a_reason_for_every_row():
    table = stored_plans.published_table(STORED)
    assert len(table.splitlines()) == 1 + 2 * len(STORED["published"]) + len(STORED["not_run"])
    for name in [*STORED["published"], *STORED["not_run"]]:
        assert name in table


# --- slow: one stored entry computed again --------------------------------------------------------------------

@pytest.mark.slow
@needs_store
def test_a_stored_entry_is_computed_again_the_same(capsys):
    """The cheapest stored entry, recomputed with the script's own code, matches what is stored; then the table
    of published plans against the planner is printed (it is the table notebook 26 shows)."""
    import importlib.metadata

    import jax

    from spmd_course.utils.tpu import tpu_compiler_available

    ok, why = tpu_compiler_available()
    if not ok:
        pytest.skip(why)
    entries = {**STORED["course"], **STORED["published"]}
    name = min(entries, key=lambda n: entries[n]["cpu_seconds"])
    stored = entries[name]
    here = {"jax": jax.__version__, "libtpu": importlib.metadata.version("libtpu")}
    if {k: stored["versions"][k] for k in here} != here:
        pytest.skip(f"the store holds jax {stored['versions']['jax']} with libtpu {stored['versions']['libtpu']}'s "
                    f"figures; this line has jax {here['jax']} with libtpu {here['libtpu']}, whose compiler gives "
                    "other HBM figures")
    fresh = plans_tool.course_entry(name) if name in plans_tool.COURSE else plans_tool.published_entry(
        next(r for r in ROWS if r.name == name))
    with capsys.disabled():
        print(f"\n{name}, computed again:\n{fresh['table']}\n\n{stored_plans.published_table(STORED)}")
    assert plans_tool.compare(stored, fresh) == []


@pytest.mark.slow
@needs_store
def test_print_the_published_plans_against_the_planner(capsys):
    """make test-slow prints the table on every line (it is read from the store: nothing is compiled)."""
    table = stored_plans.published_table(STORED)
    with capsys.disabled():
        print(f"\nMaxText's published plans against the planner (stored, effort O0):\n{table}")
    assert table.count("\n") >= len(STORED["published"])


def test_merge_takes_another_stores_entries(tmp_path):
    """Two processes may each fill their own store (--store); --merge joins them, and a row merged in is no
    longer listed as not run."""
    name = ROWS[0].name
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"course": {}, "published": {name: {"row": name}}, "not_run": {}}))
    store = tmp_path / "plans.json"
    assert plans_tool.main(["--dry-run", "--not-run", f"{name}=slow", "--store", str(store)]) == 0
    assert stored_plans.load(store)["not_run"] == {name: "slow"}
    assert plans_tool.main(["--dry-run", "--merge", str(other), "--store", str(store)]) == 0
    data = stored_plans.load(store)
    assert data["published"] == {name: {"row": name}} and data["not_run"] == {}
