DROP TABLE {{schema}}.ledger;
DROP TABLE {{schema}}.export_versions;
DROP TABLE {{schema}}.exports;
