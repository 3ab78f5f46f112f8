DROP TABLE {{schema}}.dead_letter_actions;
DROP TABLE {{schema}}.dead_letters;
DROP TABLE {{schema}}.topic_layouts;
DROP TABLE {{schema}}.group_incarnations;
