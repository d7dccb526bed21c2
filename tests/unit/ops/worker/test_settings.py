"""Worker settings: default < TOML `--config` < `TOKENMILL_*` env < flag; bad value: exit 2;
one name from flag to field, former names still read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from actors.config import WorkerConfig
from actors.ingest.backpressure import Watermarks
from actors.kafka.connection import KafkaConnection
from ops.settings import settings
from ops.worker.settings import default_models_dir, worker_config, worker_options


@click.command()
@worker_options
def show(**kwargs: Any) -> WorkerConfig:
    """Returns the config the worker would run with."""
    kwargs.pop("log_level")
    kwargs.pop("engine")
    config = worker_config(kwargs)
    assert not kwargs, f"options worker_config left behind: {sorted(kwargs)}"
    return config


# Every option's variable, unset: a stray setting in the shell running the tests cannot leak in.
def envvars(param: click.Parameter) -> list[str]:
    return [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())


CLEAN_ENV: dict[str, str | None] = {name: None for p in show.params for name in envvars(p)}


def run(*args: str, env: dict[str, str] | None = None, **kwargs: Any) -> Result:
    return CliRunner().invoke(show, list(args), env={**CLEAN_ENV, **(env or {})}, **kwargs)


def config_of(*args: str, env: dict[str, str] | None = None) -> WorkerConfig:
    result = run(*args, env=env, standalone_mode=False)
    assert result.exception is None, result.output
    assert isinstance(result.return_value, WorkerConfig)
    return result.return_value


def write_toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "tokenmill.toml"
    path.write_text(text)
    return str(path)


def test_every_option_has_its_env_var() -> None:
    for param in show.params:
        assert param.name
        assert envvars(param)[0] == "TOKENMILL_" + param.name.upper(), param.name


def test_defaults() -> None:
    config = config_of("--worker-id", "w1")
    assert config == WorkerConfig(
        kafka=KafkaConnection(),
        worker_id="w1",
        watermarks=Watermarks(high_requests=512, high_tokens=262144),
        # The CLI turns on what a library user opts into: control plane, HTTP, models dir,
        # the cancel reader.
        control_topic="tokenmill.control",
        cancel_topic="tokenmill.cancel",
        http_port=9464,
        models_dir=str(default_models_dir()),
        allowed_reply_to=("*.results",),
    )
    assert config.control_secret is None, "no secret: every command is refused"
    assert config_of("--cancel-topic", "").cancel_topic is None, "'' turns cancels off"
    assert config.group == "tokenmill"
    assert config.bucket_boundaries is None
    assert config.max_request_bytes == 1 << 20


def test_worker_id_defaults_to_host_and_pid() -> None:
    assert config_of().worker_id.rsplit("-", 1)[1].isdigit()


def test_env_overrides_the_default() -> None:
    config = config_of(env={"TOKENMILL_GROUP": "from-env", "TOKENMILL_MAX_WAIT_MS": "2.5"})
    assert (config.group, config.max_wait_ms) == ("from-env", 2.5)


@pytest.mark.parametrize("table", ["", "[worker]\n"], ids=["top-level", "worker-table"])
def test_toml_sets_values(tmp_path: Path, table: str) -> None:
    path = write_toml(
        tmp_path,
        table
        + 'group = "from-toml"\n'
        + "max_wait_ms = 5\n"
        + "max-batch-size = 8\n"  # the flag's spelling works too
        + 'bucket_boundaries = "16,32"\n'
        + "high_watermark_requests = 100\n",
    )
    config = config_of("--config", path)
    assert config.group == "from-toml"
    assert config.max_wait_ms == 5.0
    assert config.max_batch_size == 8
    assert config.bucket_boundaries == (16, 32)
    assert config.watermarks == Watermarks(high_requests=100, high_tokens=262144)


def test_config_from_env(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'group = "from-toml"\n')
    assert config_of(env={"TOKENMILL_CONFIG": path}).group == "from-toml"


def test_flag_beats_env_beats_toml(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path, 'group = "toml"\nresults_topic = "toml.results"\ndlq_topic = "toml.dlq"\n'
    )
    env = {"TOKENMILL_GROUP": "env", "TOKENMILL_RESULTS_TOPIC": "env.results"}
    config = config_of("--config", path, "--group", "flag", env=env)
    assert config.group == "flag"  # flag > env > TOML
    assert config.results_topic == "env.results"  # env > TOML
    assert config.dlq_topic == "toml.dlq"  # TOML > default
    assert config.requests_topic == "tokenmill.requests"  # default


def test_flag_order_does_not_matter_for_config(tmp_path: Path) -> None:
    """`--config` is eager: a flag before it still wins."""
    path = write_toml(tmp_path, 'group = "toml"\n')
    assert config_of("--group", "flag", "--config", path).group == "flag"


def test_bucket_boundaries() -> None:
    assert config_of("--bucket-boundaries", "32,64").bucket_boundaries == (32, 64)
    assert config_of("--bucket-boundaries", "32, 64,128").bucket_boundaries == (32, 64, 128)
    env = {"TOKENMILL_BUCKET_BOUNDARIES": "8"}
    assert config_of(env=env).bucket_boundaries == (8,)


def test_bucket_boundaries_as_a_toml_list(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "bucket_boundaries = [32, 64]\n")
    assert config_of("--config", path).bucket_boundaries == (32, 64)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--max-batch-size", "0"], {}, "max_batch_size must be positive, got 0"),
        ([], {"TOKENMILL_MAX_BATCH_SIZE": "0"}, "max_batch_size must be positive, got 0"),
        (["--max-request-bytes", "-1"], {}, "max_request_bytes must be positive, got -1"),
        (["--max-wait-ms", "-1"], {}, "max_wait_ms must be ≥ 0, got -1.0"),
        (["--group", ""], {}, "group must not be empty"),
        (["--high-watermark-tokens", "0"], {}, "high_requests and high_tokens must be positive"),
        (["--bucket-boundaries", "32,x"], {}, "invalid literal for int()"),
        (["--max-batch-size", "many"], {}, "'many' is not a valid integer"),
    ],
)
def test_invalid_values_are_usage_errors(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = run(*args, env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Usage:" in result.output
    assert "Traceback" not in result.output


def test_invalid_toml_value_is_a_usage_error(tmp_path: Path) -> None:
    result = run("--config", write_toml(tmp_path, "max_batch_size = 0\n"))
    assert result.exit_code == 2
    assert "max_batch_size must be positive, got 0" in result.output


def test_unreadable_toml_is_a_usage_error(tmp_path: Path) -> None:
    result = run("--config", write_toml(tmp_path, "group = \n"))
    assert result.exit_code == 2
    assert "cannot read" in result.output and "tokenmill.toml" in result.output
    missing = run("--config", str(tmp_path / "nope.toml"))
    assert missing.exit_code == 2
    assert "does not exist" in missing.output


def test_a_group_instance_id_may_name_the_host() -> None:
    import socket

    assert config_of().group_instance_id is None
    assert config_of("--group-instance-id", "w-{hostname}").group_instance_id == (
        f"w-{socket.gethostname()}"
    )
    env = {"TOKENMILL_GROUP_INSTANCE_ID": "fixed-1", "TOKENMILL_CONNECT_TIMEOUT": "5"}
    config = config_of(env=env)
    assert (config.group_instance_id, config.connect_timeout_s) == ("fixed-1", 5.0)


def test_the_kafka_settings_come_from_a_properties_file_and_flags(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text(
        "bootstrap.servers=broker:9094\nsecurity.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=SCRAM-SHA-256\nsasl.username=svc\nsasl.password=from-the-file\n"
    )
    config = config_of("--kafka-config", str(props), "--compression-type", "zstd")
    assert config.kafka == KafkaConnection(
        "broker:9094",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="svc",
        sasl_password="from-the-file",
        compression_type="zstd",
    )
    assert "from-the-file" not in repr(config)


def test_each_flag_is_its_fields_name() -> None:
    """One name from flag to field: `--commit-interval-s` sets `commit_interval_s`; a nested
    setting is its field's name after its prefix (`--stream-interval-ms`: streaming's)."""
    for setting in settings(WorkerConfig):
        assert setting.name.endswith(setting.field.name), setting.name
        option = next(p for p in show.params if p.name == setting.name)
        assert option.opts[0] == "--" + setting.name.replace("_", "-")


@pytest.mark.parametrize(
    ("old", "value", "field", "expected"),
    [
        ("commit-interval", "0.5", "commit_interval_s", 0.5),
        ("shutdown-timeout", "5", "shutdown_timeout_s", 5.0),
        ("connect-timeout", "3", "connect_timeout_s", 3.0),
        ("restart-window", "9", "restart_window_s", 9.0),
        ("swap-memory-budget", "100", "swap_memory_budget_bytes", 100),
    ],
)
def test_former_names_still_work(
    tmp_path: Path, old: str, value: str, field: str, expected: object
) -> None:
    """Flags renamed after their fields keep their old spelling as flag, env var and TOML key."""
    env_name = "TOKENMILL_" + old.replace("-", "_").upper()
    toml = write_toml(tmp_path, f"{old.replace('-', '_')} = {value}\n")
    assert getattr(config_of(f"--{old}", value), field) == expected
    assert getattr(config_of(env={env_name: value}), field) == expected
    assert getattr(config_of("--config", toml), field) == expected
    new_env = "TOKENMILL_" + field.upper()
    both = config_of(env={env_name: "1", new_env: value})
    assert getattr(both, field) == expected, "the new env var wins over the old"


def test_former_watermark_flags_still_work() -> None:
    config = config_of("--high-watermark-requests", "100", "--high-watermark-tokens", "5000")
    assert config.watermarks == Watermarks(high_requests=100, high_tokens=5000)
    new = config_of("--watermarks-high-requests", "100", "--watermarks-high-tokens", "5000")
    assert new.watermarks == config.watermarks


def test_the_guards_settings_come_from_flags_env_and_toml(tmp_path: Path) -> None:
    defaults = config_of()
    assert (defaults.watchdog_floor_s, defaults.watchdog_step_multiple) == (30.0, 10.0)
    assert defaults.max_rss is None, "no memory limit unless asked"
    flags = config_of("--watchdog-floor-s", "2", "--watchdog-step-multiple", "4",
                      "--max-rss", str(8 << 30))  # fmt: skip
    assert (flags.watchdog_floor_s, flags.watchdog_step_multiple, flags.max_rss) == (
        2.0,
        4.0,
        8 << 30,
    )
    assert config_of(env={"TOKENMILL_MAX_RSS": "1000"}).max_rss == 1000
    toml = write_toml(tmp_path, "watchdog_floor_s = 5\nmax_rss = 2000\n")
    from_file = config_of("--config", toml)
    assert (from_file.watchdog_floor_s, from_file.max_rss) == (5.0, 2000)
    for args, message in [
        (["--watchdog-floor-s", "0"], "watchdog_floor_s must be positive"),
        (["--watchdog-step-multiple", "-1"], "watchdog_step_multiple must be positive"),
        (["--max-rss", "0"], "max_rss must be positive"),
    ]:
        result = run(*args)
        assert result.exit_code == 2 and message in result.output, result.output


def test_off_values() -> None:
    """`--http-port -1`, `--control-topic ''`: the setting is off (None)."""
    config = config_of("--http-port", "-1", "--control-topic", "", "--group-instance-id", "")
    assert (config.http_port, config.control_topic, config.group_instance_id) == (None,) * 3


def test_help_lists_every_option_with_its_env_vars() -> None:
    result = run("--help", env={"TOKENMILL_CONTROL_SECRET": "hush-Xq9"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for param in show.params:
        for name in envvars(param):
            assert name in text, name
    assert "hush-Xq9" not in result.output
    assert "--commit-interval-s, --commit-interval" in text
