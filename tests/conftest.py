"""Fixtures shared by every test: a database per test, an S3 server per session.

Database: `database_url` is a fresh SQLite file, or, when
TUNEFORGE_TEST_POSTGRES_URL names a PostgreSQL admin URL (scripts/test.sh sets
it for its second run), a freshly created PostgreSQL database dropped again
after the test.

S3: `s3_endpoint` is a moto server started once per session; `s3_storage` is a
new bucket on it for one test.

Ray: `ray_head` is a one-node Ray cluster started once per session, for the
ray stage (TUNEFORGE_TEST_EXECUTOR=ray), which runs only the end-to-end and Ray
tests; other runs skip the tests marked `ray`.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

# Ray (tests/helpers/ray_cluster.py) must keep 127.0.0.1 as it is rather than swap in this
# host's own address: read when Ray is imported, so set before anything imports it.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# A test names its platform's home; whatever falls back to the default home gets a throwaway one
# of this run, never the user's data folder (tests/unit/cli/test_home.py checks the default itself).
if "TUNEFORGE_HOME" not in os.environ:
    import tempfile

    os.environ["TUNEFORGE_HOME"] = tempfile.mkdtemp(prefix="tuneforge-test-home-")

import pytest  # noqa: E402

# Plain asserts in shared helpers (e.g. store_contract) get pytest's detailed messages.
pytest.register_assert_rewrite("tests.helpers")

from tests.helpers import postgres, ray_cluster, s3  # noqa: E402
from tests.helpers.s3 import S3Storage  # noqa: E402
from tuneforge import heap  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that needs the S3 server is marked so that `-m "not s3"` skips it.
    postgres_pass = bool(os.environ.get(postgres.POSTGRES_URL_ENV))
    on_ray = ray_cluster.ray_stage()
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "s3_endpoint" in fixtures:
            item.add_marker(pytest.mark.s3)
        # The ray stage runs the Ray tests, which need a cluster (the other passes leave them to
        # it), and again on a Ray cluster the end-to-end tests whose flow goes through what differs
        # between executors (marked both_executors: launch, poll, cancel and preemption signals,
        # the objects a later job reads); the other end-to-end tests (a method's objective, the
        # gates, the CLI, the integrations) run the same trainer the same way on either executor,
        # and run once, on the local one.
        if on_ray:
            if not (item.get_closest_marker("both_executors") or item.get_closest_marker("ray")
                    or item.get_closest_marker("distributed")):
                item.add_marker(pytest.mark.skip(
                    reason="the ray stage runs the Ray tests and the end-to-end tests marked both_executors"))
            continue
        if item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.skip(reason="needs a Ray cluster: runs in the ray stage of scripts/test.sh"))
            continue
        # Training in several processes runs once: in the ray stage when scripts/test.sh runs that
        # stage too (it says so), never in the lowest stage, which does not lower torch, the library
        # these tests exercise.
        if item.get_closest_marker("distributed"):
            if os.environ.get("TUNEFORGE_TEST_LOWEST") == "1":
                item.add_marker(pytest.mark.skip(reason="torch.distributed: torch is not lowered in this stage"))
            elif os.environ.get("TUNEFORGE_TEST_DISTRIBUTED_ON_RAY") == "1":
                item.add_marker(pytest.mark.skip(reason="runs in the ray stage"))
        # The PostgreSQL pass exists for what the database does: a test that never asks
        # for a database (no `database_url` among its fixtures, directly or through
        # others) gives the same result there and ran in the SQLite pass already.
        if postgres_pass and "database_url" not in fixtures:
            item.add_marker(pytest.mark.skip(reason="uses no database: covered by the SQLite pass"))
        # The ray stage runs the end-to-end tests marked both_executors on PostgreSQL too (with
        # the Ray executor and S3); scripts/test.sh says so when it will, and this pass leaves
        # those runs to it.
        if postgres_pass and os.environ.get("TUNEFORGE_TEST_E2E_ON_RAY") == "1" and \
                item.get_closest_marker("both_executors"):
            item.add_marker(pytest.mark.skip(reason="runs on PostgreSQL in the ray stage"))
        # Long runs whose database work other tests cover on both backends run once.
        if postgres_pass and item.get_closest_marker("sqlite_pass_only"):
            item.add_marker(pytest.mark.skip(reason="trains and evaluates; its database work is covered by "
                                                    "tests that run in both passes"))


# Long-lived objects of the test process (modules, classes: half a million once torch and
# transformers are in) are frozen out of the cyclic collector's reach, as a serving process does
# (tuneforge/heap.py): otherwise every full collection walks them, the explicit one after each
# PostgreSQL test (below) included, which cost ~0.25 s a test.
_modules_at_freeze = 0


def pytest_runtest_setup(item: pytest.Item) -> None:
    global _modules_at_freeze
    _forget_compiled_writes()
    if len(sys.modules) - _modules_at_freeze >= heap.NEW_MODULES_BEFORE_SETTLING:
        gc.collect()
        gc.freeze()
        _modules_at_freeze = len(sys.modules)


def _forget_compiled_writes() -> None:
    """Empty each mapped class's cache of compiled INSERT/UPDATE/DELETE statements. SQLAlchemy keys
    it by the engine's dialect, one per engine: a server makes one engine, but each test makes its
    own, so over a run every mapper's cache fills to its bound (~150 statements of ~50 objects
    each, ~200,000 objects in all) that every full collection then walks, the explicit one
    after each PostgreSQL test included."""
    from tuneforge.db.tables import Base

    for mapper in Base.registry.mappers:
        mapper._compiled_cache.clear()


@pytest.fixture
def db_backend() -> str:
    """The backend this run targets: "postgresql" or "sqlite"."""
    return "postgresql" if os.environ.get(postgres.POSTGRES_URL_ENV) else "sqlite"


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """SQLAlchemy URL of a database that belongs to this test alone. SQLite: a file not made yet
    (`upgrade`, or tests/helpers/schema.py's copy, makes it). PostgreSQL: a database at the head
    revision, or an empty one for a test marked `empty_database` (tests/helpers/postgres.py)."""
    admin_url = os.environ.get(postgres.POSTGRES_URL_ENV)
    if not admin_url:
        yield f"sqlite:///{tmp_path}/tuneforge.db"
        return
    at_head = request.node.get_closest_marker("empty_database") is None
    name, url = postgres.lend(admin_url, at_head=at_head)
    try:
        yield url
    finally:
        # Finalise connections the test dropped without closing while their
        # database still exists: collected after the forced drop, their pool
        # reset fails, and on CPython 3.11 such a failure arriving in the middle
        # of an import can crash pytest itself ("AST constructor recursion
        # depth mismatch").
        gc.collect()
        postgres.give_back(admin_url, name, at_head=at_head)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a moto S3 server on 127.0.0.1, with dummy AWS credentials set."""
    server = s3.start_moto_server(tmp_path_factory.mktemp("moto"))
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3.AWS_ENV.items():
            patch.setenv(name, value)
        patch.delenv("AWS_PROFILE", raising=False)  # a developer's profile must not leak in
        try:
            yield server.endpoint_url
        finally:
            server.stop()


@pytest.fixture
def s3_storage(s3_endpoint: str) -> S3Storage:
    """A new bucket: `.url` (s3://bucket/prefix), `.options` (fsspec), `.env` (TUNEFORGE_*)."""
    return s3.create_bucket(s3_endpoint)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny random Llama with its trained tokenizer, built once per session."""
    from tests.helpers.tiny import build_model_once

    return build_model_once(tmp_path_factory)


@pytest.fixture(scope="session")
def ray_head() -> Iterator[ray_cluster.TestCluster]:
    """A one-node Ray cluster for the ray stage's end-to-end runs: a head with 4 logical
    GPUs and a Ray Client server, as `ray start --head --num-gpus=4` starts it."""
    cluster = ray_cluster.start_cluster(head_gpus=4, worker_gpus=[], client_server=True)
    yield cluster
    cluster.shutdown()
