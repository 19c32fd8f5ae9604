"""End to end: `circuitlab serve`'s app on a real uvicorn server, driven by a headless Chromium
through Selenium. Skipped (saying why) when selenium, chromium or chromedriver is missing;
`make test-e2e` installs them (Debian's chromium and chromium-driver) and runs this file."""
import pytest
import torch

import helpers

pytestmark = pytest.mark.e2e

PROMPT = "the dog sat on the mat"
TEXT = "the cat sat on the mat. a dog ran to the park, then the dog sat."
N_LAYERS, N_HEADS = 2, 3


@pytest.fixture(scope="module")
def server(tmp_path_factory, browser):  # the browser first: without one the tests skip before any model work
    """A uvicorn server in a thread, serving a tiny 2-layer, 3-head model; yields its base URL and tokenizer."""
    from circuitlab import ModelConfig, Transformer
    from circuitlab.data.tokenizers import CharTokenizer
    from circuitlab.serve import create_app
    from circuitlab.training import save_checkpoint

    tokenizer = CharTokenizer.from_texts([TEXT])
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=N_LAYERS, d_model=24, n_heads=N_HEADS, d_vocab=tokenizer.vocab_size, n_ctx=48)
    run = tmp_path_factory.mktemp("e2e") / "run"
    save_checkpoint(run / "checkpoint", Transformer(cfg), tokenizer)
    with helpers.live_server(create_app(run, allowed_hosts=["127.0.0.1", "localhost"])) as url:
        yield url, tokenizer




def test_explorer_shows_every_head_and_token(server, browser):
    from selenium.webdriver.common.by import By

    url, tokenizer = server
    browser.get(url + "/")
    helpers.wait_for(browser, lambda b: "layers" in b.find_element(By.ID, "model-info").text, "the model info")
    prompt = browser.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys(PROMPT)
    browser.find_element(By.ID, "analyse").click()
    heads = helpers.wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#heads [data-head]"),
                             "the attention grid")
    names = [h.get_attribute("data-head") for h in heads]
    assert names == [f"L{l}H{h}" for l in range(N_LAYERS) for h in range(N_HEADS)]
    tokens = browser.find_elements(By.CSS_SELECTOR, "#tokens .token")
    assert len(tokens) == len(tokenizer.encode(PROMPT))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#heads [data-head] canvas")) == N_LAYERS * N_HEADS
    # Plotly (served by the app, no CDN) drew the logit lens and the attribution
    helpers.wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#lens .main-svg"), "the logit lens plot")
    helpers.wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#dla .main-svg"), "the attribution plot")
    # clicking a head enlarges it; a bad target is reported on the page, not as a broken page
    heads[-1].click()
    helpers.wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#head-detail .main-svg"), "the enlarged head")
    browser.find_element(By.ID, "target").send_keys("zz")
    browser.find_element(By.ID, "analyse").click()
    helpers.wait_for(browser, lambda b: "unknown target token" in b.find_element(By.ID, "status").text,
                     "the error message")
    # the only console errors: the browser noting the 422 answer itself (no script errors)
    assert all("status of 422" in m for m in helpers.console_errors(browser)), helpers.console_errors(browser)


def test_adder_page_adds_and_steps_through_layers(server, browser):
    from selenium.webdriver.common.by import By

    url, _ = server
    browser.get(url + "/adder")
    result = helpers.wait_for(browser, lambda b: b.find_element(By.ID, "result").get_attribute("data-result") and
                              b.find_element(By.ID, "result"), "the default sum")
    assert result.get_attribute("data-result") == "42" and "correct" in result.text
    for field, value in (("a", "99"), ("b", "86")):
        box = browser.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    browser.find_element(By.ID, "add").click()
    helpers.wait_for(browser, lambda b: b.find_element(By.ID, "result").get_attribute("data-result") == "185",
                     "99 + 86")
    rows = browser.find_elements(By.CSS_SELECTOR, "#residual tbody tr")
    assert len(rows) == 5  # 9 9 8 6 EOS
    assert len(browser.find_elements(By.CSS_SELECTOR, "#eos-attention tbody tr[data-head]")) == 2
    label = browser.find_element(By.ID, "stage-label")
    assert "after layer 1" in label.text
    browser.find_element(By.ID, "prev").click()
    assert "after layer 0" in label.text
    browser.find_element(By.ID, "prev").click()
    assert "embedding" in label.text


def test_inputs_form_is_drawn_from_the_technique_registry_and_attributes(server, browser):
    """/inputs: the method menu holds every registered technique, there is an input per technique option with the
    registry's default and bounds, and a submitted form shades one line per technique."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from circuitlab.analysis.input_attribution import technique_names
    from circuitlab.serve.inputs import LIMITS, explorer_options
    from circuitlab.spec import options_of

    url, _ = server
    browser.get(url + "/inputs")
    menu = helpers.wait_for(browser, lambda b: len(b.find_elements(By.CSS_SELECTOR, "#method option")) > 1 and
                            b.find_element(By.ID, "method"), "the method menu")
    assert [o.get_attribute("value") for o in Select(menu).options] == ["all", *technique_names()]
    inputs = browser.find_elements(By.CSS_SELECTOR, "#technique-options input")
    assert len(inputs) == len(options_of(explorer_options()))
    samples = next(i for i in inputs if "samples" in i.find_element(By.XPATH, "..").text)
    assert samples.get_attribute("value") == str(explorer_options()().samples)
    assert samples.get_attribute("max") == str(LIMITS["samples"].high)
    samples.clear()
    samples.send_keys("16")   # a quick run: 16 coalitions for shap and lime
    prompt = browser.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys(PROMPT)
    browser.find_element(By.ID, "run").click()
    lines = helpers.wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#attribution .attr-line"),
                             "the shaded lines")
    names = [line.find_element(By.CSS_SELECTOR, ".method").text.split(" ")[0] for line in lines]
    assert names == list(technique_names()) and "16 coalitions" in lines[-1].text
    assert not helpers.console_errors(browser), helpers.console_errors(browser)
