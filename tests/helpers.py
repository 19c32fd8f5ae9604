"""Models shared by the tests."""
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
