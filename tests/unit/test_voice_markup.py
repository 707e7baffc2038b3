"""Markdown marks removed before speech (`omni_backends.voice.markup.speakable`)."""
import pytest

from omni_backends.voice.markup import speakable

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, spoken", [
    ("1. **Avoid caffeine:** It keeps you awake.", "1. Avoid caffeine: It keeps you awake."),
    ("- 2 cups all-purpose flour", "2 cups all-purpose flour"),
    ("## Steps\n- mix\n* bake\n+ serve", "Steps,\nmix,\nbake,\nserve"),
    ("> Quoted *wisdom* here.", "Quoted wisdom here."),
    ("Run `pip install omni` first.", "Run pip install omni first."),
    ("See [the docs](https://example.com/a_b) or ![a chart](c.png).", "See the docs or a chart."),
    ("__Strong__ and ~~struck~~ words", "Strong and struck words"),
    ("| Name | Age |\n|:---|---:|\n| Ann | 30 |", "Name, Age,\nAnn, 30"),
    ("Intro.\n\n---\n\nMore.", "Intro.\nMore."),
])
def test_marks_are_removed_and_every_word_kept(text, spoken):
    assert speakable(text) == spoken


@pytest.mark.parametrize("text", ["Plain text, with commas; and a full stop.  ", "a - b", "snake_case and 2*3",
                                  "x_1 = y_2", "It's 5 o'clock."])
def test_text_that_is_not_markup_is_unchanged(text):
    assert speakable(text) == text


@pytest.mark.parametrize("piece, spoken", [("1. **Avoid", "1. Avoid"), ("caffeine:** It", "caffeine: It"),
                                           ("`pip", "pip"), ("install`", "install")])
def test_a_chunk_cut_inside_a_mark_loses_its_half(piece, spoken):
    assert speakable(piece) == spoken


def test_control_characters_are_read_as_spaces():
    """A NUL ends the C string espeak-ng reads: Kokoro dropped the rest of the clause after one."""
    assert speakable("Hello\x00 world,\x1b red\x7f.\tTab\nline") == "Hello  world,  red .\tTab\nline"
