"""The playground page (GET /ui) in a real headless Chromium against a live loopback server.

The network is off for the browser (tests/browser.py: only loopback is reachable); every test
checks that each request the page made went to the service. Rankings on the page are compared
with what the API itself answers for exactly the same weights, ids in order.

The server is the shared ``served`` one (tiny bundle, registry with experiment ``ent``). With
``ESP_UI_BUNDLE=DIR`` the tests run against a server on that bundle instead, with
``configs/registry.example.yaml`` (a layout with semantic/entity/intent subspaces); with
``ESP_UI_SCREENSHOT=PATH`` the compare-mode test saves the page as a PNG there (README's
``docs/ui.png``: ``ESP_UI_BUNDLE=artifacts/demo/bundle ESP_UI_SCREENSHOT=docs/ui.png``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.live_server import LiveServer, start_server
from esp_retrieval.service.tuning import Registry
from esp_retrieval.subspace.atomic import atomic_write_bytes
from esp_retrieval.subspace.bundle import read_bundle
from tests.browser import Visit, require_chromium
from tests.live_fixtures import SERVER_DEFAULTS

REPO = Path(__file__).resolve().parents[2]
QUERY = "who is robert gray"
K = 10


@pytest.fixture(scope="module")
def ui_server(served: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # ``served`` is an argument, not a getfixturevalue() call: the shared server stops after its
    # last user, and only arguments say who that is (tests/live_fixtures.py)
    require_chromium()
    bundle = os.environ.get("ESP_UI_BUNDLE")
    if not bundle:
        yield served
        return
    log = tmp_path_factory.mktemp("ui-server") / "server.log"
    settings = {**SERVER_DEFAULTS, "max_k": 50}
    registry = REPO / "configs" / "registry.example.yaml"
    # a full-size bundle loads its encoder and corpus for a while on a busy machine
    with start_server(Path(bundle), log, settings=settings, registry=registry, ready_timeout=600) as server:
        yield server


def api(server: LiveServer, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    if body is None:
        return httpx.get(f"{server.url}{path}", timeout=60)
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def api_ids(server: LiveServer, **body: Any) -> list[str]:
    r = api(server, "/v1/search", {"queries": [{"text": QUERY}], "k": K, **body})
    assert r.status_code == 200, r.text
    return [h["id"] for h in r.json()["results"][0]["hits"]]


def open_ui(loopback_page: Callable[..., Visit], server: LiveServer) -> Visit:
    visit = loopback_page(f"{server.url}/ui")
    visit.page.wait_for_selector("body[data-ready=true]")
    return visit


def wait_results(visit: Visit, column: str, weights: dict[str, float]) -> list[str]:
    """Wait until column ``A``/``B`` has answered the last change (a change marks it pending at
    once, in the same event); assert it shows results for ``weights``; its hit ids in order."""
    visit.page.wait_for_function(
        "column => document.getElementById(`results-${column}`).dataset.state === 'ready'", arg=column
    )
    box = visit.page.locator(f"#results-{column}")
    used = json.loads(box.get_attribute("data-weights") or "{}")
    assert used == pytest.approx(weights, abs=1e-12)
    ids: list[str] = box.locator("li.hit").evaluate_all("els => els.map(e => e.dataset.id)")
    return ids


def slider_weights(visit: Visit, column: str, names: list[str]) -> dict[str, float]:
    """What the sliders and the exact-value boxes of weight set ``column`` show (must agree)."""
    out = {}
    for name in names:
        exact = float(visit.page.locator(f"#{column}-{name}-number").input_value())
        slider = float(visit.page.locator(f"#{column}-{name}").input_value())
        assert slider == pytest.approx(exact, abs=0.005), name  # a range snaps to its 0.01 step
        out[name] = exact
    return out


def assert_only_the_service(visit: Visit, server: LiveServer) -> None:
    assert visit.requests, "the page made no request at all"
    assert visit.outside(server.url) == []
    assert visit.blocked == []
    assert visit.errors == []
    assert [e for e in visit.console_errors if "Content Security Policy" in e] == []  # works under it


@pytest.fixture(scope="module")
def layout(ui_server: LiveServer) -> dict[str, Any]:
    body: dict[str, Any] = api(ui_server, "/v1/layout").json()
    return body


def names_of(layout: dict[str, Any]) -> list[str]:
    """Every weight's name, as the page shows its sliders: the subspaces, then the sparse blocks."""
    return [s["name"] for s in layout["subspaces"]] + [s["name"] for s in layout.get("sparse") or []]


def start_weights(server: LiveServer, layout: dict[str, Any]) -> dict[str, float]:
    """What the page starts with: the registry's default operating point, else the layout's defaults."""
    points = api(server, "/v1/operating-points").json()
    default = points["default_operating_point"]
    if default is None:
        return dict(layout["default_weights"])
    return next(p["weights"] for p in points["operating_points"] if p["name"] == default)


def test_moving_the_entity_slider_shows_the_ranking_the_api_gives_for_those_weights(
    loopback_page: Callable[..., Visit], ui_server: LiveServer, layout: dict[str, Any]
) -> None:
    names = names_of(layout)
    assert "entity" in names
    visit = open_ui(loopback_page, ui_server)
    page = visit.page
    labels = page.locator("#A .slider label").all_inner_texts()
    assert [t.split(" ")[0] for t in labels] == names  # one slider per subspace, in layout order
    weights = start_weights(ui_server, layout)
    assert slider_weights(visit, "A", names) == pytest.approx(weights)

    page.get_by_label("Query: text").fill(QUERY)
    assert wait_results(visit, "A", weights) == api_ids(ui_server, weights=weights)
    assert "Sent as text" in page.locator("#query-kind").inner_text()

    # The keyboard moves the slider: End (its maximum), then three steps back.
    entity = page.locator("#A-entity")
    entity.focus()
    page.keyboard.press("End")
    for _ in range(3):
        page.keyboard.press("ArrowLeft")
    moved = {**weights, "entity": round(float(entity.get_attribute("max") or 0) - 0.03, 2)}
    assert slider_weights(visit, "A", names) == pytest.approx(moved)
    assert page.locator("#A-entity-value").inner_text() == f"weight {moved['entity']:g}"
    shown = wait_results(visit, "A", moved)
    assert shown == api_ids(ui_server, weights=moved)
    assert shown != api_ids(ui_server, weights={**weights, "entity": 0.0}) or len(shown) <= 1

    # One change is one request (debounced; nothing else asks for a search).
    before = visit.count("POST", "/v1/search")
    page.locator("#A-semantic").fill("0.25")
    once = {**moved, "semantic": 0.25}
    assert wait_results(visit, "A", once) == api_ids(ui_server, weights=once)
    assert visit.count("POST", "/v1/search") == before + 1

    # Each hit explains its score: weight x cosine per subspace, summing to the score.
    first = page.locator("#results-A li.hit").first
    rows = first.locator("table.why tbody tr").all_inner_texts()
    assert [r.split("\t")[0] for r in rows] == names
    score = float(first.locator(".score").inner_text().removeprefix("score "))
    contributions = [float(re.split(r"\s+", r.split("\t")[2].strip())[0]) for r in rows]
    assert sum(contributions) == pytest.approx(score, abs=2e-3 * len(names))
    assert_only_the_service(visit, ui_server)


def test_picking_an_operating_point_or_an_arm_sets_the_sliders(
    loopback_page: Callable[..., Visit], ui_server: LiveServer, layout: dict[str, Any]
) -> None:
    names = names_of(layout)
    points = {p["name"]: p for p in api(ui_server, "/v1/operating-points").json()["operating_points"]}
    start = start_weights(ui_server, layout)
    name = next(n for n, p in points.items() if p["weights"] != start)
    visit = open_ui(loopback_page, ui_server)
    page = visit.page
    page.get_by_label("Query: text").fill(QUERY)
    wait_results(visit, "A", start)

    page.locator("#A-preset").select_option(f"op:{name}")
    assert slider_weights(visit, "A", names) == pytest.approx(points[name]["weights"])
    # The page sends the weights it shows; the API given the point's name ranks the same.
    assert wait_results(visit, "A", points[name]["weights"]) == api_ids(ui_server, operating_point=name)

    experiment = api(ui_server, "/v1/experiments").json()["experiments"][0]
    arm = next(a for a in experiment["arms"] if points[a["operating_point"]]["weights"] != points[name]["weights"])
    page.locator("#A-preset").select_option(f"arm:{experiment['name']}/{arm['name']}")
    arm_weights = points[arm["operating_point"]]["weights"]
    assert slider_weights(visit, "A", names) == pytest.approx(arm_weights)
    assert wait_results(visit, "A", arm_weights) == api_ids(ui_server, weights=arm_weights)

    # Moving a slider afterwards makes the weights custom again.
    page.locator(f"#A-{names[-1]}").fill("0.5")
    assert page.locator("#A-preset").input_value() == ""
    assert_only_the_service(visit, ui_server)


def test_a_bad_vector_shows_the_422_message_beside_the_query(
    loopback_page: Callable[..., Visit], ui_server: LiveServer, layout: dict[str, Any]
) -> None:
    visit = open_ui(loopback_page, ui_server)
    page = visit.page
    bad = [1.0, 2.0, 3.0]
    expected = api(ui_server, "/v1/search", {"queries": [{"vector": bad}], "k": K, "weights": start_weights(ui_server, layout)})
    assert expected.status_code == 422
    body = expected.json()
    assert body["field"] == "queries[0].vector"

    page.get_by_label("Query: text").fill("[1.0, 2.0, 3.0]")
    error = page.locator("[data-field=queries] > .error")
    error.wait_for(state="visible")
    assert body["message"].startswith("queries[0].vector has 3 components")  # names its field: said once
    assert error.inner_text() == f"Error (HTTP 422 validation_error): {body['message']}"
    assert page.locator("#query").get_attribute("aria-invalid") == "true"
    assert "Sent as a vector (3 numbers" in page.locator("#query-kind").inner_text()

    # A vector of the right length is accepted, and the error goes. A vector has no text for a
    # sparse block to score (a weight on one is a 422 naming it): those sliders go to 0 first.
    sparse_off = {s["name"]: 0.0 for s in layout.get("sparse") or []}
    for name in sparse_off:
        page.locator(f"#A-{name}-number").fill("0")
    good = [1.0] * layout["dim"]
    page.get_by_label("Query: text").fill(str(good))
    page.wait_for_function("() => document.getElementById('results-A').dataset.state === 'ready'")
    assert page.locator("[data-field=queries] > .error").is_hidden()
    weights = {**start_weights(ui_server, layout), **sparse_off}
    r = api(ui_server, "/v1/search", {"queries": [{"vector": good}], "k": K, "weights": weights})
    ids = page.locator("#results-A li.hit").evaluate_all("els => els.map(e => e.dataset.id)")
    assert ids == [h["id"] for h in r.json()["results"][0]["hits"]]

    # k is checked by the API too: its message lands beside k.
    page.get_by_label("k (hits)").fill("100000")
    k_error = page.locator("[data-field=k] > .error")
    k_error.wait_for(state="visible")
    assert k_error.inner_text().startswith("Error (HTTP 422 validation_error): k must be between 1 and ")

    # A negative weight typed into the exact-value box: the message lands beside that slider.
    page.get_by_label("k (hits)").fill(str(K))
    page.locator("#A-entity-number").fill("-1")
    w_error = page.locator('#A [data-field="weights.entity"] > .error')
    w_error.wait_for(state="visible")
    assert w_error.inner_text().startswith("Error (HTTP 422 validation_error): weights.entity: ")
    page.locator("#A .save").click()  # and no registry snippet for weights the registry refuses
    assert "Error: the registry takes weights that are finite, >= 0" in page.locator("#A-save-note").inner_text()
    assert page.locator("#A-yaml").is_hidden()
    assert k_error.is_hidden()
    assert_only_the_service(visit, ui_server)


def test_compare_mode_marks_rank_changes_and_prints_a_valid_registry_snippet(
    loopback_page: Callable[..., Visit], ui_server: LiveServer, layout: dict[str, Any]
) -> None:
    names = names_of(layout)
    points = {p["name"]: p for p in api(ui_server, "/v1/operating-points").json()["operating_points"]}
    visit = open_ui(loopback_page, ui_server)
    page = visit.page
    page.get_by_label("Query: text").fill(QUERY)
    a_weights = start_weights(ui_server, layout)
    a_ids = wait_results(visit, "A", a_weights)

    page.get_by_label("Compare two weight vectors").check()  # the keyboard toggles it as well
    # B: the point giving the entity subspace the largest share that differs from A's weights
    others = [p for p in points.values() if p["weights"] != a_weights]
    entity_first = max(others, key=lambda p: p["weights"]["entity"] / sum(p["weights"].values()))
    page.locator("#B-preset").select_option(f"op:{entity_first['name']}")
    b_weights = entity_first["weights"]
    b_ids = wait_results(visit, "B", b_weights)
    assert b_ids == api_ids(ui_server, weights=b_weights)
    assert wait_results(visit, "A", a_weights) == a_ids  # A is still there, beside B

    markers = page.locator("#results-B li.hit .marker").all_inner_texts()
    assert len(markers) == len(b_ids)
    for rank, (doc, marker) in enumerate(zip(b_ids, markers, strict=True), start=1):
        if doc not in a_ids:
            assert marker == "new: not in A's top k"
            continue
        was = a_ids.index(doc) + 1
        expected = {True: f"▲ up {was - rank} (A: #{was})", False: f"▼ down {rank - was} (A: #{was})"}
        assert marker == (f"= same rank (A: #{was})" if was == rank else expected[was > rank])

    # Save B as an operating point: a YAML snippet the registry accepts, with exactly B's weights.
    page.locator("#B .save").click()
    page.locator("#B-save-name").fill("entity_try")
    snippet = page.locator("#B-yaml").inner_text()
    doc = yaml.safe_load(snippet)
    assert doc["operating_points"]["entity_try"]["weights"] == pytest.approx(b_weights)
    served_layout = read_bundle(ui_server.bundle).weight_layout  # the blocks and the sparse blocks
    registry = Registry.parse({"version": 1, **doc}, served_layout)
    assert dict(registry.operating_points["entity_try"].weights) == pytest.approx(b_weights)
    assert list(doc["operating_points"]["entity_try"]["weights"]) == names

    screenshot = os.environ.get("ESP_UI_SCREENSHOT")
    if screenshot:
        page.locator("#B .save").click()  # fold the snippet away again: the page as a user sees it
        page.set_viewport_size({"width": 1360, "height": 1500})  # sliders and the first hits of both
        page.evaluate("window.scrollTo(0, 0)")
        png = page.screenshot(full_page=False)
        atomic_write_bytes(Path(screenshot), png)
        # what the picture shows, beside it: tests/service/routes/test_ui.py keeps it the demo's
        shown = read_bundle(ui_server.bundle)
        sidecar = {
            "png_sha256": hashlib.sha256(png).hexdigest(),
            "bundle_version": shown.version,
            "documents": len(shown.ids),
            "layout": [list(pair) for pair in zip(shown.layout.names, shown.layout.dims, strict=True)],
            "sparse": sorted(shown.sparse),
        }
        atomic_write_bytes(Path(screenshot).with_suffix(".json"), (json.dumps(sidecar, indent=2) + "\n").encode())
    assert_only_the_service(visit, ui_server)


def test_the_cluster_tab_shows_the_clusters_with_their_dominant_intent(
    loopback_page: Callable[..., Visit], ui_server: LiveServer, layout: dict[str, Any]
) -> None:
    keywords = ["robert gray", "Robert  Gray", "captain robert gray", "buy laptop online",
                "cheap laptop deals", "facebook login", "weather tomorrow"]
    visit = open_ui(loopback_page, ui_server)
    page = visit.page
    tab = page.get_by_role("tab", name="Search")
    tab.focus()
    page.keyboard.press("ArrowRight")  # the arrow keys move between the tabs
    assert page.get_by_role("tab", name="Keyword clusters").get_attribute("aria-selected") == "true"
    assert page.locator("#panel-cluster").is_visible() and page.locator("#panel-search").is_hidden()

    page.get_by_label("Keywords, one per line").fill("\n".join(keywords))
    page.get_by_label("Threshold").fill("0.5")
    page.get_by_role("button", name="Cluster").click()
    page.wait_for_function("() => document.getElementById('cluster-out').dataset.state === 'ready'")
    expected = api(ui_server, "/v1/cluster", {"keywords": keywords, "weights": start_weights(ui_server, layout), "threshold": 0.5}).json()

    rows = page.locator("table.clusters tbody tr")
    assert rows.count() == len(expected["clusters"]) + (1 if expected["noise"] else 0)
    for i, c in enumerate(expected["clusters"]):
        cells = rows.nth(i).locator("td, th").all_inner_texts()
        assert cells[:3] == [str(c["cluster_id"]), str(c["size"]), c["label"]]
        mix = list(c["intent_mix"].items())
        assert cells[3] == (f"{mix[0][0]} ({mix[0][1]} of {c['size']})" if mix else "none (no intent head)")
        members = [r["keyword"] for r in expected["keywords"] if r["cluster_id"] == c["cluster_id"]]
        assert cells[6] == ", ".join(members)
    assert "1 duplicate keyword(s) merged" in page.locator("#cluster-out").inner_text()

    # An API error on this tab lands beside its field too.
    page.get_by_label("Threshold").fill("5")
    page.get_by_role("button", name="Cluster").click()
    err = page.locator("[data-field=threshold] > .error")
    err.wait_for(state="visible")
    assert err.inner_text().startswith("Error (HTTP 422 validation_error): threshold: ")
    assert_only_the_service(visit, ui_server)
