#!/usr/bin/env python3
"""A screenshot of the chat page after a finished answer (docs/webui.png, the README's picture):
starts `specgguf serve` on the embedded chat model with n-gram drafting, asks one question in
headless Chromium (Debian's, through the system chromedriver) and saves the page as PNG.

    python scripts/webui_screenshot.py [--out docs/webui.png] [--prompt TEXT]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from serverproc import start_server  # noqa: E402

PROMPT = ("Here is a list: apples, pears, plums, cherries, grapes, figs. "
          "Copy the list exactly, then say which one is red.")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "docs" / "webui.png"))
    ap.add_argument("--prompt", default=PROMPT)
    args = ap.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    from specgguf.runtime.defaults import default_chat_target

    opts = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 f"--user-data-dir={tempfile.mkdtemp()}", "--window-size=1100,640", "--hide-scrollbars"):
        opts.add_argument(flag)
    with start_server(default_chat_target(), "--draft", "ngram", "--ctx", 2048) as server:
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
        try:
            driver.get(server.root + "/")
            WebDriverWait(driver, 30).until(lambda d: d.find_element("id", "model").get_attribute("data-id"))
            box = driver.find_element("id", "input")
            box.send_keys(args.prompt)
            box.send_keys(Keys.ENTER)
            WebDriverWait(driver, 300).until(lambda d: d.find_elements("css selector", ".msg.assistant .meta"))
            driver.save_screenshot(args.out)
        finally:
            driver.quit()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
