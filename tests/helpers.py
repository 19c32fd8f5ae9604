"""What the tests share: models, the docs' code blocks, a headless browser and a live server, a saved graph run."""
import contextlib
import re

import torch

from circuitlab import ModelConfig, Transformer


def random_model(cfg: ModelConfig, seed: int = 0, scale: float = 8.0, noise: float = 0.3) -> Transformer:
    """A Transformer whose weight matrices are `scale` times the init (sharp attention, so heads differ
    and patches matter) and whose norm gains and biases are moved off their 1 / 0 init by `noise`."""
    torch.manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".w", ".b", ".bias")):
                p.copy_((1.0 if name.endswith(".w") else 0.0) + noise * torch.randn_like(p))
            else:
                p.mul_(scale)
    return model


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def headless_chromium():
    """A Selenium driver for a headless Chromium, or pytest.skip saying what is missing
    (`make test-e2e` installs Debian's chromium, chromium-driver and selenium)."""
    import shutil

    import pytest

    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium, or run `make test-e2e`)")
    browser = next((path for path in map(shutil.which, BROWSERS) if path), None)
    if browser is None:
        pytest.skip("no Chromium browser found on PATH (apt-get install chromium, or run `make test-e2e`)")
    driver_path = shutil.which("chromedriver")
    if driver_path is None:
        pytest.skip("chromedriver not found on PATH (apt-get install chromium-driver, or run `make test-e2e`)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    except Exception as e:  # noqa: BLE001 - a browser that cannot start is an environment problem
        pytest.skip(f"headless Chromium did not start: {type(e).__name__}: {str(e).splitlines()[0]}")
    driver.set_page_load_timeout(30)
    return driver


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def live_server(app):
    """`app` served by uvicorn on 127.0.0.1 in a thread (what a browser reaches); yields the base URL, stops
    the server on exit; pytest.fail when it does not start within 20 s."""
    import threading
    import time

    import pytest
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            pytest.fail("the uvicorn server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def console_errors(browser) -> list[str]:
    """The browser console's errors (SEVERE), or [] where the driver keeps no console log."""
    try:
        return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    except Exception:  # noqa: BLE001 - not every driver keeps a console log
        return []


def wait_for(browser, condition, what: str, timeout: float = 20):
    """WebDriverWait(browser, timeout).until(condition), or pytest.fail saying what was awaited, the page's
    #status line (where it has one) and the console's errors."""
    import pytest
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(browser, timeout).until(condition)
    except TimeoutException:
        status = browser.find_elements("id", "status")
        said = f"; page status: {status[0].text}" if status else ""
        pytest.fail(f"timed out waiting for {what}{said}; console: {console_errors(browser)}")


GRAPH_PROMPT = "Lily saw a cat. Lily"


def save_char_checkpoint(folder, n_layers: int = 2, d_model: int = 16, n_ctx: int = 32, seed: int = 0) -> ModelConfig:
    """A random gpt2-tiny checkpoint in `folder` with a char tokenizer of 50 built-in stories: the model the
    dictionary-training, eval and estimate tests read from disk. Returns its config."""
    from circuitlab.data import build_tokenizer, stories_text
    from circuitlab.training import save_checkpoint

    tok = build_tokenizer("char", [stories_text(50)])
    cfg = ModelConfig.from_preset("gpt2-tiny", d_model=d_model, n_heads=2, n_layers=n_layers, d_vocab=tok.vocab_size,
                                  n_ctx=n_ctx)
    torch.manual_seed(seed)
    save_checkpoint(folder, Transformer(cfg), tok)
    return cfg


def saved_graph_run(root, prompt: str = GRAPH_PROMPT, n_layers: int = 2, d_sae: int = 48, dashboard_tokens: int = 0):
    """A runs folder for the graph viewer: root/model (a checkpoint with a char tokenizer of the built-in
    stories), root/transcoders (one random ReLU skip transcoder per layer) and root/graphs/lily (what
    `circuitlab graph` writes). Returns (model, tokenizer, Transcoders, GraphResult)."""
    from circuitlab.data.stories import generate_stories
    from circuitlab.data.tokenizers import CharTokenizer
    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
    from circuitlab.methods.graph import graph_experiment
    from circuitlab.graphs import Transcoders
    from circuitlab.training import save_checkpoint

    tokenizer = CharTokenizer.from_texts(list(generate_stories(300, 0)) + list(generate_stories(300, 1)) + [prompt])
    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=n_layers, d_model=32, n_heads=4, d_mlp=64, n_ctx=64,
                                  d_vocab=tokenizer.vocab_size)
    model = random_model(cfg, scale=1.0).eval()
    save_checkpoint(root / "model" / "checkpoint", model, tokenizer)
    dicts = []
    for layer in range(n_layers):
        dcfg = DictionaryConfig("relu", d_in=32, d_sae=d_sae, hook_name=f"blocks.{layer}.ln2.hook_normalized",
                                out_hook_name=f"blocks.{layer}.hook_mlp_out", skip=True)
        d = SparseDictionary(dcfg, seed=layer)
        g = torch.Generator().manual_seed(100 + layer)
        with torch.no_grad():
            d.W_enc.copy_(torch.randn(d.W_enc.shape, generator=g) / 32**0.5)
            d.b_enc.copy_(-0.8 + 0.1 * torch.randn(d_sae, generator=g))
            d.W_skip.copy_(0.1 * torch.randn(d.W_skip.shape, generator=g))
        d.save(root / "transcoders" / f"layer{layer}")
        dicts.append(d)
    tc = Transcoders.per_layer(model, dicts)
    run = graph_experiment(model, tc, prompt, tokenizer, out=root / "graphs" / "lily", progress=False,
                           dashboard_tokens=dashboard_tokens)
    return model, tokenizer, tc, run


PYTHON_BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", flags=re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line, info string, code) of every ```python block of a Markdown text, in order."""
    return [(text[:m.start()].count("\n") + 1, m.group(1).strip(), m.group(2)) for m in PYTHON_BLOCK.finditer(text)]


def run_blocks(blocks: list[tuple[int, str, str]], folder, name: str) -> int:
    """Run the blocks (python_blocks) in order in one namespace, as a reader pastes them into one session,
    each from a real file in `folder` (nnsight reads its trace's source back); a block whose info string says
    no-run is left out. The first that raises fails the test, naming the file and line. Returns how many ran."""
    import pytest

    namespace: dict = {"__name__": f"__{name.replace('/', '_').replace('.', '_')}__"}
    ran = 0
    for line, info, code in blocks:
        if "no-run" in info.split():
            continue
        file = folder / f"{name.replace('/', '_').replace('.', '_')}_line_{line}.py"
        file.write_text(code)
        try:
            exec(compile(code, str(file), "exec"), namespace)
        except Exception as e:  # noqa: BLE001 - say which block, then fail
            pytest.fail(f"{name} python block at line {line} fails: {type(e).__name__}: {e}\n{code}")
        ran += 1
    return ran


def demo_fixture(run, options, name: str, **sizes):
    """A module-scoped fixture running a stand-alone demo once for a test file's tests:
    run(options(out=<a fresh folder>/name, **sizes)) (the features and graphs demos at their tiny sizes)."""
    import pytest

    @pytest.fixture(scope="module")
    def demo(tmp_path_factory):
        return run(options(out=tmp_path_factory.mktemp(name) / name, **sizes))

    return demo


def fresh_process_json(code: str, timeout: float = 300):
    """Run `code` in a fresh interpreter at the repository root (src/ on its path; a fresh process, so its peak
    memory is its own) and return the JSON its last line of output prints."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PYTHONPATH": str(root / "src")})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
