"""One home wherever you stand: the operator commands find the platform's home the same way from
any folder, say which one they use, and refuse a home without a database instead of creating it;
`tuneforge up` refuses a port that is taken before it says it listens."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from tests.helpers.cli import Done, run
from tuneforge.settings import Settings, default_home


def _cli(cwd: Path, home: Path, *args: str, **extra: str) -> Done:
    """The command line as a user runs it in `cwd`: HOME is `home`, no TUNEFORGE_HOME, no XDG folder.
    In this process (tests/helpers/cli.py) with that environment and working folder for the call:
    a new interpreter per command cost ~1.5 s each."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("TUNEFORGE_") or k == "XDG_DATA_HOME"}
    env.update(HOME=str(home), **extra)
    cwd.mkdir(parents=True, exist_ok=True)
    before = Path.cwd()
    os.chdir(cwd)
    try:
        return run(*args, env=env)
    finally:
        os.chdir(before)


def test_the_default_home_is_the_users_data_folder_not_the_working_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TUNEFORGE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    expected = tmp_path / "user" / ".local" / "share" / "tuneforge"
    if sys.platform != "darwin":
        assert default_home() == expected and Settings().home == expected
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
        assert Settings().home == tmp_path / "xdg" / "tuneforge"
        monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # (the XDG rule: absolute paths only)
        assert Settings().home == expected
    monkeypatch.setenv("TUNEFORGE_HOME", str(tmp_path / "chosen"))
    assert Settings().home == tmp_path / "chosen"


def test_tenants_create_from_another_folder_reaches_the_same_home(tmp_path) -> None:
    user = tmp_path / "user"
    home = default_home_of(user)
    made = _cli(tmp_path / "where-the-server-runs", user, "init")
    assert made.returncode == 0, made.stderr
    assert f"home: {home}" in made.stderr and "created" in made.stderr
    assert (home / "tuneforge.db").is_file()

    created = _cli(tmp_path / "somewhere" / "else", user, "tenants", "create", "acme")
    assert created.returncode == 0, created.stderr
    assert f"home: {home} · database: sqlite:///{home / 'tuneforge.db'}" in created.stderr
    listed = _cli(tmp_path / "a third folder", user, "tenants", "list")
    assert listed.returncode == 0 and "acme" in listed.stdout
    assert not (tmp_path / "somewhere" / "else" / ".tuneforge").exists()  # nothing made where it ran
    again = _cli(tmp_path, user, "init")
    assert again.returncode == 0 and "upgraded" in again.stderr  # never emptied
    assert "acme" in _cli(tmp_path, user, "tenants", "list").stdout


def test_a_home_without_a_database_is_refused_with_the_reason_and_nothing_is_created(tmp_path) -> None:
    user = tmp_path / "fresh-user"
    for args in (("tenants", "create", "acme"), ("base-models", "list"), ("tenants", "usage")):
        refused = _cli(tmp_path, user, *args)
        assert refused.returncode == 2, (args, refused.stderr)
        assert "no tuneforge database at" in refused.stderr and "tuneforge init" in refused.stderr
        assert "TUNEFORGE_HOME" in refused.stderr and "Traceback" not in refused.stderr
    assert not (default_home_of(user) / "tuneforge.db").exists()
    chosen = _cli(tmp_path, user, "tenants", "list", TUNEFORGE_HOME=str(tmp_path / "named"))
    assert chosen.returncode == 2 and f"home {tmp_path / 'named'}" in chosen.stderr


def test_up_refuses_a_port_that_is_taken_before_it_says_it_listens(tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = _cli(tmp_path, tmp_path / "user", "up", "--host", "127.0.0.1", "--port", str(port),
                       TUNEFORGE_HOME=str(tmp_path / "home"))
    assert refused.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in refused.stderr and "--port" in refused.stderr
    assert "listening" not in refused.stderr and "Traceback" not in refused.stderr


def default_home_of(user: Path) -> Path:
    if sys.platform == "darwin":
        return user / "Library" / "Application Support" / "tuneforge"
    return user / ".local" / "share" / "tuneforge"
