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
