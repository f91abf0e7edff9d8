"""Config: the seed's schema loads unchanged; every field is validated with an error naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config import SEED_TOOLS, Config, ConfigError, load_config, parse_config


def test_missing_file_means_builtin_default_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          clean_environ: None) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config()
    assert [e.name for e in cfg.environments] == ["default-env"]
    assert cfg.listen_host_port == ("", 7777)


def test_repository_config_defines_seed_my_env(repo_root: Path, clean_environ: None) -> None:
    cfg = load_config(repo_root / "config.yaml")
    env = cfg.environment("my-env")
    assert env is not None
    assert env.template == "default-env-template" and env.atespace == "default"
    assert env.allowed_tools == SEED_TOOLS


def test_empty_fields_fall_back_to_defaults() -> None:
    cfg = parse_config({"listen": None, "environments": [{"name": "e", "template": "", "skills_dir": None}]})
    assert cfg.listen == ":7777"
    assert cfg.environments[0].template == "default-env-template"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"listen": "nope"}, "listen"),
        ({"environments": [{"name": "e", "template": "Bad_Name"}]}, "environments.0.template"),
        ({"environments": [{"name": "e", "allowed_tools": ["rm -rf"]}]}, "environments.0.allowed_tools"),
        ({"environments": [{"name": "e"}, {"name": "e"}]}, "environments"),
        ({"workers": {"lease_ttl_s": 60}}, "workers.lease_ttl_s"),
        ({"webhooks": {"secrets": {"a": "plain"}}}, "webhooks.secrets"),
        ({"typo_field": 1}, "typo_field"),
    ],
)
def test_invalid_fields_are_named(data: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert field in str(err.value)


def test_env_overrides_take_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(environ={"ATEFLEET_REDIS_URL": "redis://x:1/0"})
    assert isinstance(cfg, Config)
    assert cfg.redis.url == "redis://x:1/0"


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml", environ={})


def test_api_binds_loopback_only_without_auth() -> None:
    assert parse_config({"listen": ":7777"}).api_bind_host == "127.0.0.1"
    assert parse_config({"listen": "0.0.0.0:7777"}).api_bind_host == "127.0.0.1"
    key = {"name": "k", "sha256": "0" * 64}
    assert parse_config({"listen": ":7777", "auth": {"api_keys": [key]}}).api_bind_host == "0.0.0.0"
    assert parse_config({"listen": "10.0.0.5:80", "auth": {"api_keys": [key]}}).api_bind_host == "10.0.0.5"
