"""The mark that lets a restarted worker take a closing listener for a broker away."""

import os
from pathlib import Path

from dlqapp.kafka.reached import MARK_NAME, mark_reached, reached_before
from dlqapp.settings import Settings


def settings(data_dir: Path, **env: str) -> Settings:
    return Settings.from_env({"DLQ_DATA_DIR": str(data_dir), **env})


def test_a_first_start_has_not_reached_kafka(tmp_path: Path) -> None:
    assert not reached_before(settings(tmp_path))


def test_the_same_settings_reached_kafka_before(tmp_path: Path) -> None:
    mark_reached(settings(tmp_path, DLQ_KAFKA_BOOTSTRAP="k1:9092"))
    assert reached_before(settings(tmp_path, DLQ_KAFKA_BOOTSTRAP="k1:9092"))


def test_another_protocol_or_bootstrap_has_not(tmp_path: Path) -> None:
    mark_reached(settings(tmp_path, DLQ_KAFKA_BOOTSTRAP="k1:9092"))
    assert not reached_before(settings(tmp_path, DLQ_KAFKA_BOOTSTRAP="k2:9092"))
    tls = settings(
        tmp_path,
        DLQ_KAFKA_BOOTSTRAP="k1:9092",
        DLQ_KAFKA_SECURITY_PROTOCOL="SSL",
    )
    assert not reached_before(tls)


def test_the_mark_holds_no_secret(tmp_path: Path) -> None:
    secret = "s3cr3t-password"
    mark_reached(
        settings(
            tmp_path,
            DLQ_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
            DLQ_KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
            DLQ_KAFKA_SASL_USERNAME="dlqapp",
            DLQ_KAFKA_SASL_PASSWORD=secret,
        )
    )
    assert secret not in (tmp_path / MARK_NAME).read_text()


def test_an_unwritable_data_dir_is_not_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    mark_reached(settings(blocker / "data"))
    assert not reached_before(settings(blocker / "data"))


def test_a_mark_already_there_is_not_rewritten(tmp_path: Path) -> None:
    mark_reached(settings(tmp_path, DLQ_KAFKA_BOOTSTRAP="k1:9092"))
    mark = tmp_path / MARK_NAME
    os.utime(mark, (1_000_000, 1_000_000))
    mark_reached(settings(tmp_path, DLQ_KAFKA_BOOTSTRAP="k1:9092"))
    assert mark.stat().st_mtime == 1_000_000
