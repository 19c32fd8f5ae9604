"""End to end: `circuitlab serve`'s app on a real uvicorn server, driven by a headless Chromium
through Selenium. Skipped (saying why) when selenium, chromium or chromedriver is missing;
`make test-e2e` installs them (Debian's chromium and chromium-driver) and runs this file."""
import socket
import threading
import time

import pytest
import torch

import helpers

pytestmark = pytest.mark.e2e

PROMPT = "the dog sat on the mat"
TEXT = "the cat sat on the mat. a dog ran to the park, then the dog sat."
N_LAYERS, N_HEADS = 2, 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A uvicorn server in a thread, serving a tiny 2-layer, 3-head model; yields its base URL."""
    driver = helpers.headless_chromium()  # skips, saying why, without selenium or a browser
    import uvicorn

    from circuitlab import ModelConfig, Transformer
    from circuitlab.data.tokenizers import CharTokenizer
    from circuitlab.serve import create_app
    from circuitlab.training import save_checkpoint

    tokenizer = CharTokenizer.from_texts([TEXT])
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=N_LAYERS, d_model=24, n_heads=N_HEADS, d_vocab=tokenizer.vocab_size, n_ctx=48)
    run = tmp_path_factory.mktemp("e2e") / "run"
    save_checkpoint(run / "checkpoint", Transformer(cfg), tokenizer)
    port = _free_port()
    app = create_app(run, allowed_hosts=["127.0.0.1", "localhost"])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            pytest.fail("the uvicorn server did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", tokenizer, driver
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser(server):
    driver = server[2]
    yield driver
    driver.quit()


def _wait(browser, condition, what: str, timeout: float = 20):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(browser, timeout).until(condition)
    except TimeoutException:
        status = browser.find_elements("id", "status")
        pytest.fail(f"timed out waiting for {what}; page status: {status[0].text if status else '?'}; "
                    f"console: {_console_errors(browser)}")


def _console_errors(browser) -> list[str]:
    try:
        return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    except Exception:  # noqa: BLE001 - not every driver keeps a console log
        return []


def test_explorer_shows_every_head_and_token(server, browser):
    from selenium.webdriver.common.by import By

    url, tokenizer, _ = server
    browser.get(url + "/")
    _wait(browser, lambda b: "layers" in b.find_element(By.ID, "model-info").text, "the model info")
    prompt = browser.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys(PROMPT)
    browser.find_element(By.ID, "analyse").click()
    heads = _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#heads [data-head]"), "the attention grid")
    names = [h.get_attribute("data-head") for h in heads]
    assert names == [f"L{l}H{h}" for l in range(N_LAYERS) for h in range(N_HEADS)]
    tokens = browser.find_elements(By.CSS_SELECTOR, "#tokens .token")
    assert len(tokens) == len(tokenizer.encode(PROMPT))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#heads [data-head] canvas")) == N_LAYERS * N_HEADS
    # Plotly (served by the app, no CDN) drew the logit lens and the attribution
    _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#lens .main-svg"), "the logit lens plot")
    _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#dla .main-svg"), "the attribution plot")
    # clicking a head enlarges it; a bad target is reported on the page, not as a broken page
    heads[-1].click()
    _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#head-detail .main-svg"), "the enlarged head")
    browser.find_element(By.ID, "target").send_keys("zz")
    browser.find_element(By.ID, "analyse").click()
    _wait(browser, lambda b: "unknown target token" in b.find_element(By.ID, "status").text, "the error message")
    # the only console errors: the browser noting the 422 answer itself (no script errors)
    assert all("status of 422" in m for m in _console_errors(browser)), _console_errors(browser)


def test_adder_page_adds_and_steps_through_layers(server, browser):
    from selenium.webdriver.common.by import By

    url, _, _ = server
    browser.get(url + "/adder")
    result = _wait(browser, lambda b: b.find_element(By.ID, "result").get_attribute("data-result") and
                   b.find_element(By.ID, "result"), "the default sum")
    assert result.get_attribute("data-result") == "42" and "correct" in result.text
    for field, value in (("a", "99"), ("b", "86")):
        box = browser.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    browser.find_element(By.ID, "add").click()
    _wait(browser, lambda b: b.find_element(By.ID, "result").get_attribute("data-result") == "185", "99 + 86")
    rows = browser.find_elements(By.CSS_SELECTOR, "#residual tbody tr")
    assert len(rows) == 5  # 9 9 8 6 EOS
    assert len(browser.find_elements(By.CSS_SELECTOR, "#eos-attention tbody tr[data-head]")) == 2
    label = browser.find_element(By.ID, "stage-label")
    assert "after layer 1" in label.text
    browser.find_element(By.ID, "prev").click()
    assert "after layer 0" in label.text
    browser.find_element(By.ID, "prev").click()
    assert "embedding" in label.text
