"""Review (H9) of canonical()'s invisible-character rule: format characters (Unicode
category Cf) that show nothing but are neither Default_Ignorable_Code_Point nor in the
dropped set still make each copy of a word a new word. The interlinear annotation
characters U+FFF9..U+FFFB (next to the dropped U+FFF0..U+FFF8) and the Egyptian hieroglyph
format controls U+13430.. render as nothing on their own."""

from __future__ import annotations

from parley.arena.run.model_rewards import canonical, scored_text

# Copies of "great" a reader sees as the same word (canonical() kept each before).
FORMAT_COPIES = ["great\ufff9", "gr\ufffaeat", "\ufffbgreat", "great\U00013430", "gre\U00013431at"]


def test_invisible_format_characters_do_not_make_a_new_word() -> None:
    plain = "The offer is great"
    padded = plain + " " + " ".join(FORMAT_COPIES)
    assert scored_text(padded) == plain
    assert canonical(padded) == plain


def test_visible_format_characters_stay() -> None:
    """What such a rule must not drop: the Arabic number sign (U+0600) shows, it is part
    of the number it marks."""
    assert canonical("\u0600123") == "\u0600123"
