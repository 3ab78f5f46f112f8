DROP TABLE {{schema}}.export_publications;
DROP TABLE {{schema}}.export_pointers;
