"""``/docs`` and ``/redoc`` work offline (every asset they load is served by the app; the pages name no
other host), and who may open what with API keys set: the probes always, /metrics and the documentation
as ``metrics_public`` / ``docs_public`` say."""

from __future__ import annotations

import re

import pytest

from tests.api.conftest import client_for

KEY = "sk-docs-test-5b1e"
AUTH = {"Authorization": f"Bearer {KEY}"}


def linked(page: str) -> list[str]:
    """Every URL the page loads: src/href/spec-url attributes and Swagger UI's ``url:``."""
    return re.findall(r"""(?:src|href|spec-url)=["']([^"']+)["']""", page) + re.findall(r"""url: ?'([^']+)'""", page)


@pytest.mark.parametrize("page_path, asset_names", [
    ("/docs", {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"}),
    ("/redoc", {"redoc.standalone.js", "favicon.png"}),
])
def test_the_documentation_pages_load_everything_from_the_app(minilm_onnx_dir, page_path, asset_names):
    with client_for(models=[{"path": str(minilm_onnx_dir), "name": "m"}], api_keys=[KEY], docs_public=True) as c:
        page = c.get(page_path)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "http://" not in page.text and "https://" not in page.text and "//cdn" not in page.text
        links = linked(page.text)
        assert {link.rsplit("/", 1)[-1] for link in links} >= asset_names | {"openapi.json"}
        for link in links:
            assert link.startswith("/"), link  # on this server
            got = c.get(link)  # no key: docs_public opens the pages and everything they load
            assert got.status_code == 200, (link, got.text[:200])
            assert len(got.content) > 300, link
        bundle = c.get("/docs/assets/swagger-ui-bundle.js")
        assert "javascript" in bundle.headers["content-type"] and b"SwaggerUIBundle" in bundle.content
        assert c.get("/docs/assets/config.py", headers=AUTH).status_code == 404  # only the listed files


def test_docs_follow_the_prefix(minilm_onnx_dir):
    with client_for(models=[{"path": str(minilm_onnx_dir), "name": "m"}], url_prefix="/v2") as c:
        page = c.get("/v2/docs").text
        assert "/v2/docs/assets/swagger-ui-bundle.js" in page and "/v2/openapi.json" in page
        assert c.get("/v2/docs/assets/swagger-ui.css").status_code == 200


def test_with_api_keys_the_probes_stay_open_and_the_rest_follows_its_setting(minilm_onnx_dir):
    models = [{"path": str(minilm_onnx_dir), "name": "m"}]
    with client_for(models=models, api_keys=[KEY]) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/ready").status_code == 200  # platform probes send no key
        for path in ("/metrics", "/docs", "/redoc", "/openapi.json", "/docs/assets/swagger-ui.css", "/v1/models"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers=AUTH).status_code == 200, path
    with client_for(models=models, api_keys=[KEY], metrics_public=True, docs_public=True) as c:
        for path in ("/metrics", "/docs", "/openapi.json"):
            assert c.get(path).status_code == 200, path
        assert c.get("/v1/models").status_code == 401
