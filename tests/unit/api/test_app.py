"""The API's routes are built once per process and shared by the apps `create_app` makes: each
app answers from its own platform (its `app.state`), with its own settings, tenants and egress
resolver."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.helpers.platform import add_tenant, make_platform
from tuneforge.api.app import _api_routes, create_app


def test_two_apps_share_their_routes_and_each_answers_from_its_own_platform(tmp_path, database_url,
                                                                             tmp_path_factory):
    first = make_platform(tmp_path / "a", database_url)
    other_url = f"sqlite:///{tmp_path_factory.mktemp('other')}/tuneforge.db" if database_url.startswith("sqlite") \
        else database_url  # on PostgreSQL the second platform shares the test's database
    second = make_platform(tmp_path / "b", other_url, egress_allow="10.0.0.0/8")
    key_first = add_tenant(first, "alpha")
    apps = [create_app(platform=first), create_app(platform=second)]
    shared = _api_routes()  # every route of the API but the probes, the console and the reference
    assert shared and all(any(route is mine for mine in app.router.routes) for app in apps for route in shared)
    seen: list[tuple] = []

    def resolver(host: str) -> list[str]:
        seen.append((host,))
        return ["10.1.2.3"]

    apps[1].state.egress_resolver = resolver
    hook = {"events": ["fine_tuning.job.succeeded"]}
    with TestClient(apps[0]) as a, TestClient(apps[1]) as b:
        headers = {"Authorization": f"Bearer {key_first}"}
        assert a.get("/v1/files", headers=headers).status_code == 200
        if other_url != database_url:  # the key is the first platform's alone
            assert b.get("/v1/files", headers=headers).status_code == 401
        key_second = add_tenant(second, "beta")
        # the second app's policy: its settings allow 10.0.0.0/8, its resolver names the address
        created = b.post("/v1/webhooks", json={"url": "http://hooks.internal/x", **hook},
                         headers={"Authorization": f"Bearer {key_second}"})
        assert created.status_code == 200, created.text
        assert seen == [("hooks.internal",)]
        refused = a.post("/v1/webhooks", json={"url": "http://10.1.2.3/x", **hook}, headers=headers)
        assert refused.status_code == 400, refused.text
    for platform in (first, second):
        platform.db.dispose()


def test_an_app_and_its_platform_are_freed_once_nothing_holds_them(tmp_path, database_url):
    """No route of an app closes over it or its platform: FastAPI keeps the endpoint callables it has
    seen in caches of its own, which would keep every platform ever served alive."""
    import gc
    import weakref

    platform = make_platform(tmp_path, database_url, docs_access="public")
    key = add_tenant(platform, "alpha")
    app = create_app(platform=platform)
    with TestClient(app) as client:
        for path in ("/healthz", "/openapi.json", "/docs", "/redoc"):
            assert client.get(path).status_code == 200, path
        assert "checks" in client.get("/readyz").json()  # ready or not (no scheduler runs here)
        assert client.get("/v1/files", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    platform.db.dispose()
    gone_platform, gone_app = weakref.ref(platform), weakref.ref(app)
    del platform, app, client
    gc.collect()
    assert gone_app() is None
    assert gone_platform() is None
