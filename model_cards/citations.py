"""BibTeX for the papers behind hub-vit's models, keyed by the arXiv ids `hub_vit.catalog` uses (`PAPER_*`).

The entries are the papers' arXiv records (authors, title, year, identifier) written out as BibTeX; which ones a card
cites follows from the model: ViT always, SimpleViT for big_vision-style models, AugReg for AugReg checkpoints.
"""

from __future__ import annotations

from hub_vit.catalog import PAPER_AUGREG, PAPER_SIMPLEVIT, PAPER_VIT

BIBTEX: dict[str, str] = {
    PAPER_VIT: """@article{dosovitskiy2020vit,
  title   = {An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale},
  author  = {Dosovitskiy, Alexey and Beyer, Lucas and Kolesnikov, Alexander and Weissenborn, Dirk and
             Zhai, Xiaohua and Unterthiner, Thomas and Dehghani, Mostafa and Minderer, Matthias and
             Heigold, Georg and Gelly, Sylvain and Uszkoreit, Jakob and Houlsby, Neil},
  journal = {arXiv preprint arXiv:2010.11929},
  year    = {2020}
}""",
    PAPER_SIMPLEVIT: """@article{beyer2022betterplainvit,
  title   = {Better plain ViT baselines for ImageNet-1k},
  author  = {Beyer, Lucas and Zhai, Xiaohua and Kolesnikov, Alexander},
  journal = {arXiv preprint arXiv:2205.01580},
  year    = {2022}
}""",
    PAPER_AUGREG: """@article{steiner2021augreg,
  title   = {How to train your ViT? Data, Augmentation, and Regularization in Vision Transformers},
  author  = {Steiner, Andreas and Kolesnikov, Alexander and Zhai, Xiaohua and Wightman, Ross and
             Uszkoreit, Jakob and Beyer, Lucas},
  journal = {arXiv preprint arXiv:2106.10270},
  year    = {2021}
}""",
}

TITLES: dict[str, str] = {
    PAPER_VIT: "An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale",
    PAPER_SIMPLEVIT: "Better plain ViT baselines for ImageNet-1k",
    PAPER_AUGREG: "How to train your ViT? Data, Augmentation, and Regularization in Vision Transformers",
}


def arxiv_url(paper: str) -> str:
    """`"arXiv:2205.01580"` -> `"https://arxiv.org/abs/2205.01580"`."""
    return f"https://arxiv.org/abs/{paper.removeprefix('arXiv:')}"


def papers_for(*, simplevit: bool, augreg: bool = False, extra: tuple[str, ...] = ()) -> list[str]:
    """The arXiv ids a card cites, in a stable order: ViT, then SimpleViT, then AugReg, then anything else known."""
    papers = [PAPER_VIT]
    if simplevit:
        papers.append(PAPER_SIMPLEVIT)
    if augreg:
        papers.append(PAPER_AUGREG)
    papers += [p for p in extra if p in BIBTEX and p not in papers]
    return papers


def bibtex_for(papers: list[str]) -> list[str]:
    unknown = [p for p in papers if p not in BIBTEX]
    if unknown:
        raise ValueError(f"no BibTeX for paper(s) {unknown}; known: {', '.join(BIBTEX)}")
    return [BIBTEX[p] for p in papers]
