"""The submit page's recipe editor (CodeJar, vendored) driven by the keyboard in headless
Chromium: its accessible name, Enter keeping the previous line's indentation (one level more
after `key:`), Tab and Shift+Tab on a line and on a selection of lines, undo, YAML keys drawn
as key spans, Escape then Tab leaving the editor, and an edit saved as the draft.

Needs Debian's chromium and chromium-driver and the `selenium` package, like the other
dashboard tests. Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("selenium", reason="needs the selenium package (pip)")

from browser_kit import NEEDS_CHROMIUM, chromium, css, shot, sign_in, wait_until  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

pytestmark = NEEDS_CHROMIUM


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with chromium() as driver:
        yield driver


@pytest.fixture
def editor(stack, browser):
    """The submit page, its editor emptied and focused."""
    driver = sign_in(browser, stack)
    driver.execute_script("sessionStorage.removeItem('tuneyard.draftRecipe');")
    driver.get(f"{stack.url}/submit")
    box = wait_until(lambda: css(driver, "#recipe[contenteditable]"), 10, "the recipe editor")
    box.click()
    return box


def _text(driver: webdriver.Chrome) -> str:
    return driver.execute_script("return document.querySelector('#recipe').value;")


def _type(driver: webdriver.Chrome, *keys: str) -> None:
    ActionChains(driver).send_keys(*keys).perform()


def _chord(driver: webdriver.Chrome, modifier: str, *keys: str) -> None:
    ActionChains(driver).key_down(modifier).send_keys(*keys).key_up(modifier).perform()


def test_the_editor_is_a_named_multiline_textbox(editor, browser) -> None:
    driver = browser
    assert editor.get_attribute("role") == "textbox"
    assert editor.get_attribute("aria-multiline") == "true"
    assert editor.accessible_name == "Recipe (YAML or JSON)"
    assert driver.switch_to.active_element == editor  # reached and focused like a field
    assert "Tab indents" in css(driver, "#" + editor.get_attribute("aria-describedby")).text


def test_enter_keeps_indentation_and_tab_indents(editor, browser) -> None:
    driver = browser
    _type(driver, "optimizer:", Keys.ENTER, "lr: 0.1", Keys.ENTER, "betas: [0.9]")
    # One level more after `key:`, then the previous line's indentation kept.
    assert _text(driver) == "optimizer:\n  lr: 0.1\n  betas: [0.9]"
    _type(driver, Keys.ENTER, Keys.TAB, "x: 1")
    assert _text(driver).endswith("\n  betas: [0.9]\n    x: 1")
    _type(driver, Keys.HOME)
    _chord(driver, Keys.SHIFT, Keys.TAB)  # dedents the line by one level
    assert _text(driver).endswith("\n  betas: [0.9]\n  x: 1")
    spans = "return [...document.querySelectorAll(`#recipe span.${arguments[0]}`)]"
    spans += ".map((s) => s.textContent);"
    keys = ["optimizer", "lr", "betas", "x"]  # each YAML key drawn as a key span
    wait_until(lambda: driver.execute_script(spans, "y-key") == keys, 5, "the keys highlighted")
    assert driver.execute_script(spans, "y-num") == ["0.1", "1"]
    draft = "return sessionStorage.getItem('tuneyard.draftRecipe');"
    wait_until(lambda: driver.execute_script(draft) == _text(driver), 5, "the draft saved")
    assert css(driver, "#gutter").text.split() == ["1", "2", "3", "4"]
    shot(driver, "16-submit-editor")


def test_enter_at_the_top_level_and_at_the_end_adds_a_plain_line(editor, browser) -> None:
    driver = browser
    _type(driver, "a: 1", Keys.ENTER, Keys.ENTER, "b: 2")
    assert _text(driver) == "a: 1\n\nb: 2"
    assert css(driver, "#gutter").text.split() == ["1", "2", "3"]


def test_tab_on_a_selection_indents_every_line_and_undo_takes_it_back(editor, browser) -> None:
    driver = browser
    set_and_announce = (
        "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'));"
    )
    driver.execute_script(set_and_announce, editor, "a: 1\nb: 2\nc: 3")
    editor.click()
    _chord(driver, Keys.CONTROL, Keys.HOME)
    _chord(driver, Keys.SHIFT, Keys.DOWN, Keys.END)
    _type(driver, Keys.TAB)
    assert _text(driver) == "  a: 1\n  b: 2\nc: 3"
    _chord(driver, Keys.SHIFT, Keys.TAB)
    assert _text(driver) == "a: 1\nb: 2\nc: 3"
    _type(driver, Keys.TAB)
    _chord(driver, Keys.CONTROL, "z")
    wait_until(lambda: _text(driver) == "a: 1\nb: 2\nc: 3", 5, "the indent undone")


def test_escape_then_tab_leaves_the_editor(editor, browser) -> None:
    driver = browser
    _type(driver, "a:")
    # CodeJar highlights 30 ms after the last key and puts the caret back, which focuses the
    # editor again; a person's Escape then Tab comes later than that, so the test waits too.
    wait_until(lambda: css(driver, "#recipe .y-key"), 5, "the line highlighted")
    _type(driver, Keys.ESCAPE, Keys.TAB)
    assert driver.switch_to.active_element != editor
    assert _text(driver) == "a:"  # the Tab moved the focus, it typed nothing


def test_errors_sit_beside_their_line_and_the_line_link_selects_it(
    editor, browser, valid_recipe
) -> None:
    driver = browser
    recipe = valid_recipe.replace(
        "optimizer: {_target_: torch.optim.AdamW, lr: 1.0e-3}",
        "optimizer:\n  _target_: torch.optim.AdamW\n  lrr: 1.0e-3",
    )
    line = recipe.splitlines().index("  lrr: 1.0e-3") + 1
    # Set as a script (a test, an extension) sets a textarea: no input event.
    driver.execute_script("arguments[0].value = arguments[1];", editor, recipe)
    css(driver, "#validate").click()
    error = wait_until(lambda: css(driver, "li[data-loc='optimizer.lrr']"), 20, "the field error")
    assert f"line {line}" in error.text
    assert css(driver, "#gutter .bad").text == f"● {line}"
    beside = css(driver, f".editor .line-note[data-line='{line}']")
    assert beside.is_displayed() and "lrr" in beside.text
    css(driver, f"#errors a[data-line='{line}']").click()
    assert driver.switch_to.active_element == editor
    assert driver.execute_script("return getSelection().toString();") == "  lrr: 1.0e-3"
    shot(driver, "17-submit-editor-error-line")
    _type(driver, Keys.END, " # typo")  # an edit moves lines: the notes go until validated again
    wait_until(lambda: not css(driver, ".editor .line-note"), 5, "the notes removed")
    assert _text(driver).endswith("  lrr: 1.0e-3 # typo\n")


def test_a_template_fills_the_editor_highlighted(editor, browser) -> None:
    from selenium.webdriver.support.ui import Select

    driver = browser
    wait_until(lambda: len(Select(css(driver, "#template")).options) > 1, 10, "the templates")
    Select(css(driver, "#template")).select_by_index(1)
    wait_until(lambda: "model" in _text(driver), 10, "the template's recipe")
    assert css(driver, "#recipe .y-key")
    lines = _text(driver).count("\n") + 1
    assert len(css(driver, "#gutter").text.split("\n")) == lines
