"""The rank status file's fields are defined once (ranks/rank_status.py): what a rank's agent
writes is what the notebook's readers name."""

from __future__ import annotations

import typing

from singlecard_nb.ranks import rank_status
from singlecard_nb.ranks.agent import Agent


def _keys(kind: type) -> set[str]:
    return set(typing.get_type_hints(kind))


def test_what_the_agent_writes_is_the_defined_status(tmp_path):
    agent = Agent(tmp_path, 0)
    agent.every_beat(lambda: {rank_status.RECORDS: {"GPT": 3}})
    try:
        raise ValueError("bad batch")
    except ValueError as error:
        agent.raised(error)
    agent.left(2)
    agent._failed(OSError("disk full"))
    agent._beat()
    status = rank_status.read(tmp_path, 0)
    assert status is not None and set(status) <= rank_status.FIELDS, set(status) - rank_status.FIELDS
    assert set(status[rank_status.RAISED]) == _keys(rank_status.Raised)
    assert set(status[rank_status.LEFT]) == _keys(rank_status.Left)
    assert status[rank_status.RECORDS] == {"GPT": 3}
    assert status[rank_status.AGENT_ERROR] == "OSError: disk full"


def test_every_named_field_is_a_field_of_the_status():
    named = {value for name, value in vars(rank_status).items()
             if name.isupper() and isinstance(value, str)}
    assert named == rank_status.FIELDS


def test_a_native_death_is_read_as_a_fault_place(tmp_path):
    (tmp_path / "rank1.json").write_text('{"rank": 1, "progress": 4}')
    (tmp_path / "rank1.fault").write_text(
        "Fatal Python error: Aborted\n\nCurrent thread 0x00007f (most recent call first):\n"
        '  File "/job/train.py", line 7 in main\n'
        '  File "<frozen runpy>", line 88 in _run_module_as_main\n')
    status = rank_status.read(tmp_path, 1)
    assert status[rank_status.FAULT] == {"error": "Aborted", "where": "/job/train.py:7",
                                          "function": "main", "collective": None}
