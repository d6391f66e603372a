"""hub_vit.train"""
