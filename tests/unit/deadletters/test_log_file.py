"""The dead-letter log: appended in order on a thread of its own, rotated, never raising."""

from __future__ import annotations

import threading

from dlqapp.deadletters import log_file
from dlqapp.deadletters.log_file import DeadLetterLog


def test_lines_land_in_order_and_the_file_rotates_at_its_size(tmp_path):
    path = tmp_path / "dead-letters.jsonl"
    dead_letters = DeadLetterLog(str(path), max_bytes=100, backups=2)
    lines = [f'{{"request_id":"r{n:03d}","pad":"{"x" * 20}"}}' for n in range(12)]
    for line in lines:
        dead_letters.append(line)
    dead_letters.flush()
    kept = [p for p in (path.with_name(path.name + ".2"), path.with_name(path.name + ".1"), path) if p.exists()]
    written = [line for p in kept for line in p.read_text().splitlines()]
    assert written == lines[-4:]  # two lines a file (53 bytes each), two backups: the newest, in order
    assert not path.with_name(path.name + ".3").exists()


def test_an_append_does_not_wait_for_the_disk(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "dead-letters.jsonl"
    held, release = threading.Event(), threading.Event()
    makedirs = log_file.os.makedirs

    def slow_makedirs(*args, **kwargs):
        held.set()
        release.wait(10)
        makedirs(*args, **kwargs)

    monkeypatch.setattr(log_file.os, "makedirs", slow_makedirs)
    dead_letters = DeadLetterLog(str(path))
    dead_letters.append('{"request_id":"r1"}')  # returns while the disk is held
    assert held.wait(5) and not path.exists()
    release.set()
    dead_letters.flush()
    assert path.read_text() == '{"request_id":"r1"}\n'


def test_a_line_that_cannot_be_written_is_logged_not_raised(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    dead_letters = DeadLetterLog(str(blocker / "dead-letters.jsonl"))  # its directory is a file
    dead_letters.append('{"request_id":"r1"}')
    dead_letters.flush()
    assert any("dead_letter_log_not_written" in r.getMessage() for r in caplog.records)
