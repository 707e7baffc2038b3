"""Fixed English sentences for speech round trips (TTS -> ASR) shared by unit and integration tests."""

ROUND_TRIP = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back when you get home tonight.",
    "The train to London leaves at seven in the morning.",
    "She bought three apples and a loaf of bread.",
    "Our meeting has been moved to Thursday afternoon.",
    "The museum is closed on Mondays and public holidays.",
    "Turn left at the second traffic light.",
    "He plays the piano every evening after dinner.",
    "The weather will be cold and windy tomorrow.",
    "Remember to water the plants before you leave.",
]


def word_error_rate(references: str | list[str], heard: str | list[str]) -> float:
    """jiwer's WER of what ASR heard against the references, both lower-cased without punctuation."""
    import jiwer

    normalize = jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(), jiwer.RemoveMultipleSpaces(),
                               jiwer.Strip(), jiwer.ReduceToListOfListOfWords()])
    return jiwer.wer(references, heard, reference_transform=normalize, hypothesis_transform=normalize)
