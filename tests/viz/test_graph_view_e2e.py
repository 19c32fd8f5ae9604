"""End to end: the attribution-graph viewer in a real headless Chromium (Selenium), as report.html opened
from disk (offline) and as /graphs of `circuitlab serve`. Skipped (saying why) without selenium, chromium or
chromedriver; `make test-e2e` installs them. The counts the page shows are checked against results.json and
against export.reprune / Graph.prune."""
import json

import pytest

import helpers
from circuitlab.methods.graph import graph_experiment
from circuitlab.graphs.export import reprune

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("graph-e2e")
    model, tokenizer, tc, run = helpers.saved_graph_run(root, dashboard_tokens=512)
    return root, run


@pytest.fixture(scope="module")
def server(runs):
    from circuitlab.serve import create_app

    root, _ = runs
    app = create_app(root / "model", graphs=root / "graphs", transcoders=root / "transcoders",
                     graph_runner=graph_experiment, allowed_hosts=["127.0.0.1", "localhost"])
    with helpers.live_server(app) as url:
        yield url




def _counts(browser) -> tuple[int, int]:
    el = browser.find_element("css selector", ".clgv-count")
    return int(el.get_attribute("data-nodes")), int(el.get_attribute("data-links"))


def _slide(browser, cls: str, value: float) -> None:
    browser.execute_script("const s = document.querySelector(arguments[0]); s.value = arguments[1];"
                           "s.dispatchEvent(new Event('input'));", "." + cls, value)


def _click_node(browser, node_id: str) -> None:
    browser.execute_script("document.querySelector(`.clgv-node[data-id='${arguments[0]}']`)"
                           ".dispatchEvent(new MouseEvent('click', {bubbles: true}));", node_id)


def test_report_opens_offline_with_the_files_numbers_and_reprunes(runs, browser):
    root, run = runs
    folder = root / "graphs" / "lily"
    results = json.loads((folder / "results.json").read_text())
    data = json.loads((folder / "graph.json").read_text())
    browser.get((folder / "report.html").as_uri())
    helpers.wait_for(browser, lambda b: b.find_elements("css selector", ".clgv-count[data-nodes]"), "the graph view")
    # offline: the page fetched nothing (everything inlined)
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert _counts(browser) == (results["graph"]["pruned"]["nodes"], results["graph"]["pruned"]["edges"])
    assert len(browser.find_elements("css selector", ".clgv-node")) == results["graph"]["pruned"]["nodes"]
    assert len(browser.find_elements("css selector", ".clgv-edge")) == results["graph"]["pruned"]["edges"]
    # click a feature: its strongest paths down to a token and up to a logit light up
    feature = max((n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"),
                  key=lambda n: -n["influence_before"])
    _click_node(browser, feature["node_id"])
    lit = browser.find_elements("css selector", ".clgv-edge.hl")
    assert lit and len(lit) < results["graph"]["pruned"]["edges"] or results["graph"]["pruned"]["edges"] <= 2
    assert browser.find_elements("css selector", ".clgv-node.embedding.hl")
    assert browser.find_elements("css selector", ".clgv-node.logit.hl")
    assert feature["node_id"] in browser.find_element("css selector", ".clgv-node.selected").get_attribute("data-id")
    # re-prune with the sliders: the page's counts are export.reprune's, which is Graph.prune's
    n_file = data["metadata"]["node_threshold"]
    for edge_threshold in (0.9, 0.6):
        _slide(browser, "clgv-edge-threshold", edge_threshold)
        want = run.graph.prune(n_file, edge_threshold)
        assert _counts(browser) == (int(want.node_mask.sum()), int(want.edge_mask.sum()))
    _slide(browser, "clgv-node-threshold", 0.5)
    nodes, links = reprune(data, 0.5, 0.6)
    assert _counts(browser) == (len(nodes), len(links))
    # back to the file's thresholds: the file's counts again; hover a feature: its card from the embedded dashboards
    _slide(browser, "clgv-node-threshold", n_file)
    _slide(browser, "clgv-edge-threshold", data["metadata"]["edge_threshold"])
    assert _counts(browser) == (results["graph"]["pruned"]["nodes"], results["graph"]["pruned"]["edges"])
    browser.execute_script("document.querySelector('.clgv-node.cross-layer-transcoder')"
                           ".dispatchEvent(new MouseEvent('mouseenter', {pageX: 10, pageY: 10}));")
    helpers.wait_for(browser, lambda b: b.find_elements("css selector", ".clgv-tip .clgv-context"), "a feature card")
    assert [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_a_file_without_our_fields_opens_and_its_node_slider_uses_the_cumulative_influence(runs, browser, tmp_path):
    """circuit-tracer's / Neuronpedia's files carry no influence_before and no edge threshold."""
    from circuitlab.viz.graph_view import graph_view_html

    root, _ = runs
    data = json.loads((root / "graphs/lily/graph.json").read_text())
    for x in data["nodes"] + data["links"]:
        x.pop("influence_before", None)
    for key in ("edge_threshold", "n_layers", "scores"):
        data["metadata"].pop(key)
    page = tmp_path / "foreign.html"
    page.write_text(graph_view_html(data, page=True))
    browser.get(page.as_uri())
    helpers.wait_for(browser, lambda b: b.find_elements("css selector", ".clgv-count[data-nodes]"), "the foreign graph")
    nodes, links = reprune(data, data["metadata"]["node_threshold"], 1.0)
    assert _counts(browser) == (len(nodes), len(links))
    _slide(browser, "clgv-node-threshold", 0.4)
    nodes, links = reprune(data, 0.4, 1.0)
    assert _counts(browser) == (len(nodes), len(links)) and len(nodes) < len(data["nodes"])
    assert [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_served_page_saves_a_supernode_that_reloads_and_intervenes(runs, server, browser):
    root, _ = runs
    data = json.loads((root / "graphs/lily/graph.json").read_text())
    feats = [n["node_id"] for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"][:2]
    browser.get(server + "/graphs?id=lily")
    helpers.wait_for(browser, lambda b: b.find_elements("css selector", ".clgv-count[data-nodes]"),
                     "the served graph view")
    assert _counts(browser) == (len(data["nodes"]), len(data["links"]))
    for node_id in feats:
        _click_node(browser, node_id)
        browser.find_element("css selector", ".clgv-pin").click()
    assert len(browser.find_elements("css selector", ".clgv-node.pinned")) == len(feats)
    browser.find_element("css selector", ".clgv-supernode-name").send_keys("say Lily")
    browser.find_element("css selector", ".clgv-group").click()
    browser.find_element("css selector", ".clgv-save").click()
    helpers.wait_for(browser, lambda b: "saved" in b.find_element("css selector", ".clgv-save-status").text, "the save")
    saved = json.loads((root / "graphs/lily/graph.json").read_text())["qParams"]
    assert saved["supernodes"] == [["say Lily", *feats]]
    browser.refresh()
    helpers.wait_for(browser, lambda b: b.find_elements("css selector", ".clgv-supernode[data-name='say Lily']"),
                     "the reload")
    assert len(browser.find_elements("css selector", ".clgv-node.in-supernode")) == len(feats)
    assert browser.find_element("css selector", ".clgv-supernode-box").get_attribute("data-name") == "say Lily"
    # intervene on the supernode: four columns of top tokens
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("css selector", ".clgv-iv-which")).select_by_value("super:say Lily")
    browser.find_element("css selector", ".clgv-iv-run").click()
    table = helpers.wait_for(browser, lambda b: b.find_elements("css selector", ".clgv-iv-table"), "the intervention")
    assert len(table[0].find_elements("css selector", "th")) == 4
    # hover: the card is computed by the server on demand
    browser.execute_script("document.querySelector('.clgv-node.cross-layer-transcoder')"
                           ".dispatchEvent(new MouseEvent('mouseenter', {pageX: 10, pageY: 10}));")
    helpers.wait_for(browser, lambda b: b.find_elements("css selector", ".clgv-tip .clgv-context"),
                     "a served feature card", timeout=60)


def test_served_page_lists_opens_and_names_the_graph_in_the_url(runs, server, browser):
    """/graphs with no ?id: the browser (CLGraphView.browse, started by graph_view.js) lists the graph, shows the
    compute form with GraphOptions' defaults, opens the chosen graph and names it in the URL."""
    from circuitlab.graphs.options import DEFAULTS

    root, _ = runs
    data = json.loads((root / "graphs/lily/graph.json").read_text())
    browser.get(server + "/graphs")
    helpers.wait_for(browser, lambda b: b.find_elements("css selector", "#graph-list option[value='lily']"), "the list")
    assert browser.find_element("id", "graph-info").text.startswith("1 graph(s) under ")
    assert browser.find_element("id", "compute-form").is_displayed()
    value = browser.find_element("id", "option-node_threshold").get_attribute("value")
    assert float(value) == DEFAULTS.node_threshold
    browser.find_element("id", "open").click()
    helpers.wait_for(browser, lambda b: b.find_elements("css selector", "#viewer .clgv-count[data-nodes]"), "the graph")
    assert _counts(browser) == (len(data["nodes"]), len(data["links"]))
    assert browser.current_url == server + "/graphs?id=lily"
    assert [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_clicking_an_edge_shows_the_heads_that_carried_it(runs, browser):
    """A cross-position link's head loadings (graph.json: heads, heads_rest) as one bar per head, largest first."""
    root, _ = runs
    folder = root / "graphs" / "lily"
    data = json.loads((folder / "graph.json").read_text())
    carried = [x for x in data["links"] if x.get("heads")]
    assert carried, "the pruned graph has cross-position edges"
    x = max(carried, key=lambda x: abs(x["weight"]))
    browser.get((folder / "report.html").as_uri())
    helpers.wait_for(browser, lambda b: b.find_elements("css selector", ".clgv-count[data-nodes]"), "the graph view")
    browser.execute_script("document.querySelector(`.clgv-edge[data-source='${arguments[0]}'][data-target="
                           "'${arguments[1]}']`).dispatchEvent(new MouseEvent('click', {bubbles: true}));",
                           x["source"], x["target"])
    rows = browser.find_elements("css selector", ".clgv-head-row")
    rest = abs(x["heads_rest"]) > 1e-9 * abs(x["weight"])
    assert len(rows) == len(x["heads"]) + rest
    assert rows[0].text.startswith("L{}H{}".format(*x["heads"][0][:2]))
    assert browser.find_elements("css selector", ".clgv-bar.pos, .clgv-bar.neg")
    assert [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
