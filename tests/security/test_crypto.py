"""Sealing at rest: a key of the settings or one generated once (0600), rotation without
downtime (NEW,OLD opens both; rotate re-seals under NEW), a dropped key is a clear error."""

from __future__ import annotations

import os
import stat

import pytest

from tuneforge.security.crypto import SEALED_PREFIX, Sealer, SecretsKeyError, new_key, sealer_for


def test_seal_and_open_round_trip_and_hide_the_value():
    sealer = Sealer.parse(new_key())
    sealed = sealer.seal("sk-1234")
    assert sealed.startswith(SEALED_PREFIX) and "sk-1234" not in sealed
    assert sealer.open(sealed) == "sk-1234"
    assert sealer.seal("sk-1234") != sealed  # a fresh IV each time


def test_rotation_keeps_old_values_readable_and_reseals_them_under_the_new_key():
    old, new = new_key(), new_key()
    sealed_old = Sealer.parse(old).seal("v1")
    both = Sealer.parse(f"{new},{old}")
    assert both.open(sealed_old) == "v1"
    resealed = both.reseal(sealed_old)
    assert Sealer.parse(new).open(resealed) == "v1"  # OLD can now be dropped
    with pytest.raises(SecretsKeyError, match="none of the keys"):
        Sealer.parse(new).open(sealed_old)


def test_a_value_stored_before_encryption_reads_as_it_is_and_gets_sealed_by_rotation():
    sealer = Sealer.parse(new_key())
    assert sealer.open("whsec_plain") == "whsec_plain"
    assert sealer.open(sealer.reseal("whsec_plain")) == "whsec_plain"
    assert sealer.reseal("whsec_plain").startswith(SEALED_PREFIX)


def test_a_malformed_key_is_a_clear_error():
    with pytest.raises(SecretsKeyError, match="Fernet keys"):
        Sealer.parse("not-a-key")


def test_without_a_setting_a_key_is_generated_once_readable_by_its_user_only(tmp_path):
    first = sealer_for(None, tmp_path / "home")
    path = tmp_path / "home" / "secrets.key"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    second = sealer_for("", tmp_path / "home")
    assert second.open(first.seal("x")) == "x"
    assert first.keys == second.keys
