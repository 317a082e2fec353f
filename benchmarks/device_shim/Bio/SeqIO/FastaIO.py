def SimpleFastaParser(handle):
    title, parts = None, []
    for line in handle:
        if line.startswith(">"):
            if title is not None:
                yield title, "".join(parts)
            title, parts = line[1:].rstrip(), []
        elif title is not None:
            parts.append(line.strip().replace(" ", "").replace("\r", ""))
    if title is not None:
        yield title, "".join(parts)
