"""Saved records against unlucky and hostile files: odd names, two writers, broken and crafted
files, failing disks. Each load error names the file; no file can make `load` run without end."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading

import pytest
import torch
from torch import nn

import singlecard_nb as scn
from singlecard_nb.inspection.runs import record_file


def _recorded(scale: float = 1.0):
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    with torch.no_grad():
        model[0].weight.fill_(scale)
    with scn.inspect(model) as insp:
        model(torch.ones(2, 4))
    return insp


@pytest.mark.parametrize(("name", "misread"), [("exp#2.db", "exp"), ("100%41.db", "100A.db"),
                                              ("a?b.db", "a"), ("with space.db", "with")])
def test_a_file_name_with_uri_characters_loads_its_own_rows(tmp_path, name, misread):
    # sqlite's URI parsing once cut 'exp#2.db' at '#' and read 'exp' instead: another run
    other = tmp_path / misread
    _recorded(scale=5.0).save(other)
    insp = _recorded(scale=1.0)
    path = insp.save(tmp_path / name)
    assert path.name == name
    loaded = scn.load(path)
    assert loaded["max"].max() == pytest.approx(insp.frame()["max"].max())
    assert loaded["max"].max() != pytest.approx(scn.load(other)["max"].max())


def test_two_threads_saving_to_one_path_leave_one_whole_file(tmp_path):
    frames = [_recorded(scale=float(i + 1)).frame() for i in range(2)]
    target = tmp_path / "run.db"
    errors: list[BaseException] = []

    def save(frame) -> None:
        try:
            for _ in range(20):
                record_file.save(frame, target)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=save, args=(f,)) for f in frames]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    loaded = scn.load(target)
    assert len(loaded) == len(frames[0])  # one writer's file, whole
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]


def test_a_truncated_file_among_ranks_is_named(tmp_path):
    _recorded().save(tmp_path / "job.rank0.db")
    _recorded().save(tmp_path / "job.rank1.db")
    broken = tmp_path / "job.rank1.db"
    broken.write_bytes(broken.read_bytes()[:1500])  # the header survives, the tables do not
    with pytest.raises(ValueError, match="job.rank1.db"):
        scn.load(tmp_path)


def test_a_crafted_recursive_view_is_refused_at_once(tmp_path):
    path = tmp_path / "crafted.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE record_columns (position INTEGER, name TEXT, kind TEXT);"
        "CREATE TABLE record_meta (key TEXT, value TEXT);"
        "CREATE VIEW records AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r)"
        " SELECT x FROM r;")
    db.close()
    # in a child with a time limit: reading such a view once grew memory without end
    code = ("import singlecard_nb as scn, sys\n"
            "try:\n    scn.load(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "crafted.db" in done.stdout and "not one written by insp.save" in done.stdout


def test_deeply_nested_metadata_is_named_not_a_crash(tmp_path):
    path = _recorded().save(tmp_path / "deep.db")
    db = sqlite3.connect(path)
    db.execute("UPDATE record_meta SET value = ? WHERE key = 'model'", ("[" * 100_000,))
    db.commit()
    db.close()
    with pytest.raises(ValueError, match="deep.db"):
        scn.load(path)


def test_a_field_other_than_rank_in_a_path_says_what_is_accepted(tmp_path):
    with pytest.raises(ValueError, match=r"\{date\}.*only field.*\{rank\}"):
        _recorded().save(str(tmp_path / "{date}.db"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_folder_without_write_permission_is_named(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(OSError, match="locked"):
            _recorded().save(folder / "run.db")
    finally:
        folder.chmod(0o700)


def test_a_failing_write_names_the_file_and_leaves_no_partial_open(tmp_path, monkeypatch):
    # A full disk, simulated: sqlite fails while writing rows.
    real_connect = sqlite3.connect
    opened: list[sqlite3.Connection] = []

    class FullDisk(sqlite3.Connection):
        def executemany(self, *args, **kwargs):
            raise sqlite3.OperationalError("database or disk is full")

    def connect(*args, **kwargs):
        db = real_connect(*args, factory=FullDisk, **kwargs)
        opened.append(db)
        return db

    monkeypatch.setattr(record_file.sqlite3, "connect", connect)
    with pytest.raises(OSError, match=r"run\.db.*disk is full"):
        _recorded().save(tmp_path / "run.db")
    monkeypatch.undo()
    assert opened and all(_closed(db) for db in opened)
    assert list(tmp_path.iterdir()) == []


def _closed(db: sqlite3.Connection) -> bool:
    try:
        db.execute("select 1")
    except sqlite3.ProgrammingError:
        return True
    return False


def _crafted(tmp_path, sql: str, *args):
    path = _recorded().save(tmp_path / "crafted.db")
    db = sqlite3.connect(path)
    db.executescript(sql) if not args else db.execute(sql, args)
    db.commit()
    db.close()
    return path


def test_a_generated_column_is_refused_naming_the_file_without_being_computed(tmp_path):
    # 16 KiB on disk; read, the generated column made hundreds of MB per row
    path = _crafted(tmp_path, "ALTER TABLE records ADD COLUMN big BLOB "
                    "GENERATED ALWAYS AS (zeroblob(300000000)) VIRTUAL;"
                    "INSERT INTO record_columns VALUES (99, 'big', 'json');")
    assert os.path.getsize(path) < 64 << 10
    with pytest.raises(ValueError, match=r"crafted\.db.*'big'.*generated column"):
        scn.load(path)


def test_a_generated_column_nobody_listed_is_not_read(tmp_path):
    path = _crafted(tmp_path, "ALTER TABLE records ADD COLUMN big BLOB "
                    "GENERATED ALWAYS AS (zeroblob(300000000)) VIRTUAL;")
    frame = scn.load(path)
    assert "big" not in frame.columns and len(frame) == len(_recorded().frame())


@pytest.mark.parametrize("rank", ["[1, 2]", '"one"', "-1", "true", "1.5", "null"])
def test_a_crafted_rank_is_refused_naming_the_file(tmp_path, rank):
    path = _crafted(tmp_path, "UPDATE record_meta SET value = ? WHERE key = 'rank'", rank)
    with pytest.raises(ValueError, match=r"crafted\.db.*its rank is"):
        scn.load([path, path.with_name("crafted.db")])


@pytest.mark.parametrize("kind", ["S2000000000", "object", "category", "datetime64[ns]"])
def test_a_column_kind_save_never_writes_is_refused_naming_the_file(tmp_path, kind):
    path = _crafted(tmp_path, "UPDATE record_columns SET kind = ? WHERE name = 'mean'", kind)
    with pytest.raises(ValueError, match=r"crafted\.db.*column 'mean' has kind"):
        scn.load(path)


def test_a_virtual_table_in_place_of_the_rows_is_refused(tmp_path):
    path = _crafted(tmp_path, "DROP TABLE records; CREATE VIRTUAL TABLE records USING "
                    "fts5(mean);")
    with pytest.raises(ValueError, match=r"crafted\.db.*not one written by insp\.save"):
        scn.load(path)



# --- a file edited by hand: refused in one line as it loads, never a pandas error later -------
def test_the_columns_a_file_must_hold_are_the_inspectors_frame_columns():
    from singlecard_nb.inspection.recording.store import COLUMNS
    from singlecard_nb.inspection.runs.record_file import ROW_COLUMNS

    assert tuple(ROW_COLUMNS) == COLUMNS


@pytest.mark.parametrize(("edit", "said"), [
    ("DELETE FROM record_columns WHERE name = 'absmax'",
     r"crafted\.db': its record_columns lists no column absmax"),
    ("UPDATE records SET module = NULL WHERE rowid = 2",
     r"crafted\.db': 1 of its 4 records has no module \(NULL; the first is row 2\)"),
    ("UPDATE record_columns SET kind = 'float64' WHERE name = 'module'",
     r"crafted\.db': column 'module' has kind 'float64', where insp\.save\(\) writes text"),
    ("UPDATE records SET step = NULL", r"crafted\.db': 4 of its 4 records have no step"),
])
def test_a_hand_edited_file_is_refused_in_one_line_naming_it(tmp_path, edit, said):
    path = _crafted(tmp_path, edit)
    with pytest.raises(ValueError, match=said) as refused:
        scn.load(path)
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match=said):
        scn.findings(path)


def test_an_empty_record_file_loads(tmp_path):
    with scn.inspect(nn.Linear(2, 2)) as insp:  # never called: no rows
        pass
    loaded = scn.load(insp.save(tmp_path / "empty.db"))
    assert len(loaded) == 0 and "absmax" in loaded.columns


def test_findings_and_compare_ranks_answer_a_frame_they_cannot_read_in_a_sentence():
    frame = _recorded().frame()
    with pytest.raises(ValueError, match=r"findings\(\): these records have no column absmax"):
        scn.findings(frame.drop(columns=["absmax"]))
    with pytest.raises(ValueError, match=r"findings\(\): these records hold no rows"):
        scn.findings(frame.iloc[:0])
    unnamed = frame.astype({"module": object})
    unnamed.loc[1, "module"] = None
    with pytest.raises(ValueError, match=r"findings\(\): 1 of these records have no module"):
        scn.findings(unnamed)
    with pytest.raises(ValueError, match=r"compare_ranks\(\): these records hold no rows"):
        scn.compare_ranks(frame.iloc[:0])
    with pytest.raises(ValueError, match=r"records without the columns \['step'\]"):
        scn.compare_ranks(frame.drop(columns=["step"]))
    assert "nothing to compare" in repr(scn.compare(frame.iloc[:0], frame))
